"""Faults around whole daemon processes, with the real engine (CPU backend): a twin started with
the same config exits at once (code 75) and harms nothing, with or without a status port; a
SIGKILL of the whole process tree leaves /dev/shm entries that the restart removes (the default
shm prefix is stable per config); and the CLI ends hostile arguments with a message and code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuzk_mp.daemon.client import synthetic_partitions
from cuzk_mp.daemon.config import default_shm_prefix
from tests.helpers import (ENV, PY, DaemonProcess, check_proofs, config_text, ended_unreaped, frozen_tree, shm_inodes,
                           shm_leftovers)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PY, *args], env=ENV, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_twin_daemon_exits_at_once_and_harms_nothing(tmp_path: Path) -> None:
    prefix = f"cuzk-twin-{os.getpid()}"
    port = _free_port()
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix, status_port=port))
    no_port = tmp_path / "no-port.toml"  # the same journal and socket, no status listener
    no_port.write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix))
    first = DaemonProcess(cfg, tmp_path)
    try:
        first.wait_ready()
        with first.client() as c:
            job = c.submit("syn", synthetic_partitions(6, first_seed=70)).job_id
            before = {p["name"]: (p["pid"], p["restarts"]) for p in c.status(detail=True)["processes"]}
            shm_before = shm_inodes(prefix)
            for twin_cfg in (cfg, no_port):
                t0 = time.monotonic()
                twin = _cli("daemon", "--config", str(twin_cfg), timeout=60)
                assert twin.returncode == 75, twin.stderr
                assert time.monotonic() - t0 < 30
                assert f"pid {first.proc.pid}" in twin.stderr and "journal.sqlite" in twin.stderr
                assert "Traceback" not in twin.stderr
            assert shm_inodes(prefix).keys() >= {k for k in shm_before if k.endswith(("-ctl", "-free", "-ready"))}
            assert all(shm_inodes(prefix).get(k) == v for k, v in shm_before.items()
                       if k.endswith(("-ctl", "-free", "-ready")))
            r = c.await_proof(job, timeout_s=300)
            assert r.state == "done", r
            check_proofs(c.verification_key("syn"), r)
            after = {p["name"]: (p["pid"], p["restarts"]) for p in c.status(detail=True)["processes"]}
            assert after == before  # no child died or was restarted
            assert c.prove("crit", synthetic_partitions(1), timeout_s=300).state == "done"
            assert c.status()["job_counts"]["done"] == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            assert resp.status == 200
        assert (tmp_path / "cuzk.sock").exists()
        assert first.terminate(timeout=60) == 0, first.log()
    finally:
        first.kill()
    assert shm_leftovers(prefix) == []


@contextlib.contextmanager
def _ring_starts_beside() -> Iterator[None]:
    """What a new ring's start does to the other rings of this user (shm_names.remove_abandoned),
    every 2 ms on a thread of this process while the block runs."""
    from cuzk_mp.pipeline.shm_names import remove_abandoned

    done = threading.Event()

    def sweep() -> None:
        while not done.wait(0.002):
            remove_abandoned(None)

    t = threading.Thread(target=sweep, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def test_a_killed_process_tree_leaves_nothing_after_the_restart(tmp_path: Path) -> None:
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=""))  # the default prefix
    prefix = default_shm_prefix(tmp_path / "journal.sqlite")
    first = DaemonProcess(cfg, tmp_path)
    try:
        first.wait_ready()
        with first.client() as c:
            job = c.submit("syn", synthetic_partitions(20, first_seed=300)).job_id
            deadline = time.monotonic() + 180
            while not any(p.state == "done" for p in c.await_proof(job, 0.2).partitions):
                assert time.monotonic() < deadline
        tree = frozen_tree(first.proc.pid)
        assert len(tree) >= 3
        # meanwhile rings are made elsewhere, as other tests' engines start: each removes the rings of makers
        # that are gone, so the dead ring is read while its engine is an unreaped zombie, which they spare
        with _ring_starts_beside():
            for p in tree:  # the whole tree at once, as the OOM killer or TimeoutStopSec would
                p.send_signal(signal.SIGKILL)
            ended_unreaped(tree)
            left = shm_inodes(prefix)
    finally:
        first.sigkill()
    assert left, "the killed tree should have left its ring behind"

    second = DaemonProcess(cfg, tmp_path)
    try:
        second.wait_ready()
        now = shm_inodes(prefix)
        assert not [k for k, ino in left.items() if now.get(k) == ino], "the restart kept the dead ring's entries"
        with second.client() as c:
            r = c.await_proof(job, timeout_s=300)  # the journaled job survives the kill
            assert r.state == "done", r
        assert second.terminate(timeout=60) == 0, second.log()
    finally:
        second.kill()
    assert shm_leftovers(prefix) == []


@pytest.mark.parametrize("timeout", ["1e300", "inf", "-inf", "nan", "-1", "1e8", "soon"])
def test_client_await_with_an_absurd_timeout_is_a_message(timeout: str) -> None:
    proc = _cli("client", "await", "some-job", "--connect", "unix:///nonexistent/cuzk.sock",
                f"--timeout={timeout}")
    assert proc.returncode == 2, proc.stderr
    assert "--timeout" in proc.stderr and "not a number of seconds" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_daemon_check_warns_and_refuses(tmp_path: Path) -> None:
    base = config_text(tmp_path, tmp_path / "keys", prefix="cuzk-check")
    world = tmp_path / "world.toml"
    world.write_text(base.replace("[daemon]\n", '[daemon]\nsocket_mode = "0777"\n'))
    proc = _cli("daemon", "--config", str(world), "--check")
    assert proc.returncode == 0 and "warning" in proc.stderr and "0777" in proc.stderr, proc.stderr
    assert "1 warnings" in proc.stdout
    open_tcp = tmp_path / "open.toml"
    open_tcp.write_text(base.replace(f'listen = "unix://{tmp_path}/cuzk.sock"', 'listen = "0.0.0.0:9820"'))
    proc = _cli("daemon", "--config", str(open_tcp), "--check")
    assert proc.returncode == 2 and "daemon.listen = '0.0.0.0:9820' is reachable" in proc.stderr, proc.stderr
    assert "daemon.tokens" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("daemon", "--config", str(open_tcp))  # the same when starting: nothing is touched
    assert proc.returncode == 2 and not (tmp_path / "keys").exists()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(open_tcp.read_text().replace("[daemon]\n", '[daemon]\ntokens = ["s3cret-t0ken-000000001"]\n'))
    tokens.chmod(0o600)
    proc = _cli("daemon", "--config", str(tokens), "--check")
    assert proc.returncode == 0 and "clear text" in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout


def test_client_token_from_the_environment_and_the_flag(tmp_path: Path) -> None:
    """The CLI carries the token: a daemon requiring one refuses the call without it (exit 2)."""
    token = "cli-token-0123456789"
    cfg = tmp_path / "cuzk.toml"
    prefix = f"cuzk-tok-{os.getpid()}"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix).replace(
        "[daemon]\n", f'[daemon]\ntokens = ["{token}"]\n'))
    d = DaemonProcess(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "cuzk.sock").exists():
            assert d.proc.poll() is None and time.monotonic() < deadline, d.log()
            time.sleep(0.2)
        ready = "running"
        while True:
            proc = _cli("client", "ready", "--connect", d.addr, "--token", token)
            if proc.stdout.strip() == ready:
                break
            assert time.monotonic() < deadline, proc.stderr + d.log()
            time.sleep(0.5)
        proc = _cli("client", "status", "--connect", d.addr)
        assert proc.returncode == 2 and "requires a token" in proc.stderr, proc.stderr
        env_proc = subprocess.run([*PY, "client", "status", "--connect", d.addr], env={**ENV, "CUZK_MP_TOKEN": token},
                                  capture_output=True, text=True, timeout=60, check=False)
        assert env_proc.returncode == 0 and json.loads(env_proc.stdout)["daemon"]["pid"] is None
        assert d.terminate(timeout=60) == 0, d.log()
    finally:
        d.kill()
    assert shm_leftovers(prefix) == []


def test_a_lock_name_held_by_another_user_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any local user may bind a prefix's abstract lock name first: the refusal names that user's uid
    and pid instead of calling the holder a daemon of this one."""
    from cuzk_mp.daemon.instance_lock import AlreadyRunning, InstanceLock

    prefix = f"cuzk-squat-{os.getpid()}"
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(f"\0cuzk-mp-shm:{prefix}")
    squatter.listen(1)
    try:
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)  # this process as another user than the holder
        with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()} of another user \\(uid {real}\\)"):
            InstanceLock([], prefix).acquire()
        monkeypatch.setattr(os, "getuid", lambda: real)
        with pytest.raises(AlreadyRunning, match=f"another cuzk-mp daemon \\(pid {os.getpid()}\\)"):
            InstanceLock([], prefix).acquire()
    finally:
        squatter.close()


def test_instance_locks_name_the_holder_and_go_with_it(tmp_path: Path) -> None:
    from cuzk_mp.daemon.instance_lock import AlreadyRunning, InstanceLock, lock_paths

    paths = lock_paths(tmp_path / "j" / "journal.sqlite", [str(tmp_path / "s.sock")])
    assert [p.name for p in paths] == ["journal.sqlite.lock", "s.sock.lock"]
    prefix = f"cuzk-lock-{os.getpid()}"
    first = InstanceLock(paths, prefix)
    first.acquire()
    try:
        for other in (InstanceLock(paths[:1]), InstanceLock(paths[1:]), InstanceLock([], prefix)):
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
                other.acquire()
        both = InstanceLock([tmp_path / "free.lock"], prefix)
        with pytest.raises(AlreadyRunning, match="shm prefix"):
            both.acquire()
        assert not both._fds  # all or nothing: the free lock was given back
        InstanceLock([tmp_path / "free.lock"]).acquire()  # and can be taken
    finally:
        first.release()
    again = InstanceLock(paths, prefix)
    again.acquire()
    again.release()
    # a SIGKILLed holder leaves nothing that blocks the next one
    holder = subprocess.Popen([*PY[:1], "-c", (
        "import sys, time; from pathlib import Path; from cuzk_mp.daemon.instance_lock import InstanceLock; "
        f"lock = InstanceLock([Path({str(paths[0])!r})], {prefix!r}); lock.acquire(); print('held', flush=True); "
        "time.sleep(60)")],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyRunning, match=f"pid {holder.pid}"):
            InstanceLock([], prefix).acquire()
    finally:
        holder.kill()
        holder.wait()
    last = InstanceLock(paths, prefix)
    last.acquire()
    last.release()


def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    """The lock files sit beside the journal and the socket, which may be in a folder others can write:
    a symbolic link there (to a file the daemon may write) is refused, not followed and truncated."""
    from cuzk_mp.daemon.instance_lock import InstanceLock
    from cuzk_mp.errors import ConfigError

    victim = tmp_path / "victim.txt"
    victim.write_text("important data\n")
    (tmp_path / "d.sock.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"d\.sock\.lock: a symbolic link where the daemon keeps its lock file"):
        InstanceLock([tmp_path / "d.sock.lock"]).acquire()
    assert victim.read_text() == "important data\n"
    (tmp_path / "fifo.lock").mkdir()
    with pytest.raises((ConfigError, IsADirectoryError)):
        InstanceLock([tmp_path / "fifo.lock"]).acquire()
    lock = InstanceLock([tmp_path / "j.sqlite.lock"])
    lock.acquire()  # a fresh one: made, held
    lock.release()


def test_a_start_timeout_names_the_config_key_that_sets_it(tmp_path: Path) -> None:
    """An engine whose processes send no READY in time fails the daemon's start with the limit as set
    and the config key that sets it, not the engine's field name."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=f"cuzk-stt-{os.getpid()}").replace(
        "[pipeline]\n", '[pipeline]\nstart_timeout = "0.05s"\n'))
    run = subprocess.run([*PY, "daemon", "--config", str(cfg)], env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "within 0.05 s (set by pipeline.start_timeout" in run.stderr, run.stderr[-2000:]


def test_one_journal_reached_through_a_link_and_by_its_own_path_is_locked_once(tmp_path: Path) -> None:
    """Two daemons whose configs name one journal, one through a symlink and one by the file's own path
    (each with its own shm prefix, so that lock does not meet): each took the lock beside the path it
    was given, and both started on one journal (the second resubmitting the first's queued jobs as its
    own). The lock beside the file the link leads to is taken too, so the second finds it held."""
    from cuzk_mp.daemon.instance_lock import AlreadyRunning, InstanceLock, lock_paths

    real = tmp_path / "disk" / "journal.sqlite"
    real.parent.mkdir()
    real.write_bytes(b"")
    link = tmp_path / "journal.sqlite"
    link.symlink_to(real)
    through_link = InstanceLock(lock_paths(link, []), f"cuzk-link-a-{os.getpid()}")
    through_link.acquire()
    try:
        with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
            InstanceLock(lock_paths(real, []), f"cuzk-link-b-{os.getpid()}").acquire()
    finally:
        through_link.release()
    assert [p.name for p in lock_paths(real, [])] == ["journal.sqlite.lock"]  # a journal that is no link: one lock
    folder_link = tmp_path / "folder-link"
    folder_link.symlink_to(real.parent)
    one = lock_paths(folder_link / "journal.sqlite", [])  # through a linked folder: the same lock file, once
    assert one == [folder_link / "journal.sqlite.lock"]
    InstanceLock(one).acquire()
