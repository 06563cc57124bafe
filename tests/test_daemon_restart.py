"""The daemon across a restart: SIGTERM in the middle of a job drains within the grace period,
exits 0 and leaves nothing behind; the job stays in the journal and completes after a restart.
systemd's notify protocol is checked on the way (READY=1 once serving, STOPPING=1 on SIGTERM).
Also: a config with an unknown key never starts, and says which key."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

from cuzk_mp.daemon.client import synthetic_partitions
from cuzk_mp.daemon.journal import Journal
from tests.helpers import (
    ENV, PY, DaemonProcess, check_proofs, config_text, shm_leftovers,
)

# The job the SIGTERM cuts: ~3.5 s of proving on a 2-core machine, the drain's engine grace 1 s.
RESTART_PARTITIONS = 90


def _config(tmp_path: Path, tag: str, grace: str = "30s") -> tuple[str, Path]:
    """(shm prefix, config file) of a test daemon in ``tmp_path``: the file written."""
    prefix = f"cuzk-{tag}-{os.getpid()}"
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix, grace=grace))
    return prefix, cfg


def test_unknown_config_key_fails_start_naming_it(tmp_path: Path) -> None:
    text = config_text(tmp_path, tmp_path / "keys", prefix="cuzk-badcfg").replace(
        "[synthesis]\n", "[synthesis]\npartition_wrokers = 3\n")
    (tmp_path / "bad.toml").write_text(text)
    proc = subprocess.run([*PY, "daemon", "--config", str(tmp_path / "bad.toml")], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "synthesis.partition_wrokers" in proc.stderr and "bad.toml" in proc.stderr
    assert not (tmp_path / "cuzk.sock").exists()


def test_sigterm_mid_job_then_restart_completes_from_the_journal(tmp_path: Path) -> None:
    prefix, cfg = _config(tmp_path, "rs", grace="7s")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(10)
    first = DaemonProcess(cfg, tmp_path, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        first.wait_ready()
        starting = []  # STATUS lines while the engine starts, then READY
        while not (ready := notify.recv(4096).decode()).startswith("READY=1"):
            starting.append(ready)
        assert f"MAINPID={first.proc.pid}" in ready
        assert starting and all(m.startswith("STATUS=") for m in starting), starting
        with first.client() as c:
            # far more partitions than the drain's 1 s of engine grace can finish (a 2^10 partition
            # takes ~40 ms on a 2-core machine: 30 of them were once all done within the grace)
            job = c.submit("syn", synthetic_partitions(RESTART_PARTITIONS, first_seed=1000),
                           request_id="restart-me").job_id
            deadline = time.monotonic() + 120
            while not any(p.state == "done" for p in c.await_proof(job, 0.2).partitions):
                assert time.monotonic() < deadline
        t0 = time.monotonic()
        assert first.terminate(timeout=60) == 0, first.log()
        assert time.monotonic() - t0 < 7 + 3, "drain overran shutdown_grace"
        while (stopping := notify.recv(4096)).startswith(b"STATUS="):
            pass
        assert stopping == b"STOPPING=1"
    finally:
        first.kill()
        notify.close()
    assert not (tmp_path / "cuzk.sock").exists()
    assert shm_leftovers(prefix) == []
    journal = Journal.open(tmp_path / "journal.sqlite")
    try:
        [entry] = journal.load()
    finally:
        journal.close()
    assert entry.job_id == job and entry.state == "queued" and len(entry.partitions) == RESTART_PARTITIONS

    second = DaemonProcess(cfg, tmp_path)
    try:
        second.wait_ready()
        with second.client() as c:
            r = c.await_proof(job, timeout_s=300)
            assert r.state == "done", r
            assert all(p.public for p in r.partitions)
            check_proofs(c.verification_key("syn"), r)
            dup = c.submit("syn", synthetic_partitions(RESTART_PARTITIONS, first_seed=1000),
                           request_id="restart-me")
            assert dup.duplicate and dup.state == "done"
        assert second.terminate(timeout=60) == 0, second.log()
    finally:
        second.kill()
    assert shm_leftovers(prefix) == []
    assert "1 jobs resubmitted" in second.log()


def test_sigkill_loses_no_accepted_job(tmp_path: Path) -> None:
    prefix, cfg = _config(tmp_path, "rk")
    first = DaemonProcess(cfg, tmp_path)
    try:
        first.wait_ready()
        with first.client() as c:
            a = c.submit("syn", synthetic_partitions(6, first_seed=50)).job_id
            b = c.submit("crit", synthetic_partitions(1, first_seed=60)).job_id
            deadline = time.monotonic() + 120
            while not any(p.state == "done" for p in c.await_proof(a, 0.2).partitions):
                assert time.monotonic() < deadline
    finally:
        first.sigkill()  # no drain, no cleanup; its children exit on their death pipes
    assert (tmp_path / "cuzk.sock").exists()  # left behind: the next start must replace it

    second = DaemonProcess(cfg, tmp_path)
    try:
        second.wait_ready()
        with second.client() as c:
            for job in (a, b):
                r = c.await_proof(job, timeout_s=300)
                assert r.state == "done", r
                check_proofs(c.verification_key(r.circuit_id), r)
        assert second.terminate(timeout=60) == 0, second.log()
    finally:
        second.kill()
    assert shm_leftovers(prefix) == [] and not (tmp_path / "cuzk.sock").exists()


def _journaled(journal: Path, job_id: str) -> bool:
    """Whether the daemon's journal holds ``job_id`` (a committed row; read-only, beside the daemon)."""
    if not journal.exists():
        return False
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None
    finally:
        db.close()


def test_a_client_that_loses_the_daemon_names_its_job(tmp_path: Path) -> None:
    """``client prove`` without --request-id, the daemon killed under it: the client exits 3 and
    names the job it made the id of; after a restart that id awaits the finished, valid proofs."""
    prefix, cfg = _config(tmp_path, "rc")
    first = DaemonProcess(cfg, tmp_path)
    client = None
    try:
        first.wait_ready()
        argv = [*PY, "client", "prove", "--connect", first.addr, "--circuit", "syn", "--partitions", "12",
                "--out", str(tmp_path / "out")]
        client = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with first.client() as c:
            deadline = time.monotonic() + 120
            while not c.status()["jobs"]:
                assert time.monotonic() < deadline and client.poll() is None
                time.sleep(0.05)
            job = c.status()["jobs"][0]["job_id"]
        # the status lists a job from its submit on, the journal holds it once the daemon accepted it:
        # killed before that, the daemon never took the job (the client's message says "if")
        while not _journaled(tmp_path / "journal.sqlite", job):
            assert time.monotonic() < deadline and client.poll() is None
            time.sleep(0.05)
    finally:
        first.sigkill()
    assert client is not None
    _, err = client.communicate(timeout=60)
    assert client.returncode == 3, err
    assert f"goes on as job {job}" in err and f"cuzk-mp client await {job}" in err

    second = DaemonProcess(cfg, tmp_path)
    try:
        second.wait_ready()
        with second.client() as c:
            r = c.await_proof(job, timeout_s=300)
            assert r.state == "done" and len(r.partitions) == 12, r
            check_proofs(c.verification_key(r.circuit_id), r)
        assert second.terminate(timeout=60) == 0, second.log()
    finally:
        second.kill()
    assert shm_leftovers(prefix) == []


def test_sighup_is_logged_and_the_daemon_keeps_serving(tmp_path: Path) -> None:
    prefix, cfg = _config(tmp_path, "rh")
    d = DaemonProcess(cfg, tmp_path)
    try:
        d.wait_ready()
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "SIGHUP: ignored" not in d.log():
            assert time.monotonic() < deadline and d.proc.poll() is None, d.log()
            time.sleep(0.05)
        with d.client() as c:
            r = c.prove("syn", synthetic_partitions(1), timeout_s=120)
            assert r.state == "done"
            check_proofs(c.verification_key(r.circuit_id), r)
        assert d.terminate(timeout=60) == 0, d.log()
    finally:
        d.kill()
    assert shm_leftovers(prefix) == [] and not (tmp_path / "cuzk.sock").exists()
