"""The daemon end to end: a real ``cuzk-mp daemon`` process with the real Engine (CPU backend,
synthetic porep-like circuits at 2^10 rows) on a unix socket in a temp dir, driven through the
client, the CLI, raw frames, HTTP and scripts/batch-prove.sh. Proofs are checked with cuzk-mp's
verifier and, when the node tools are installed, with snarkjs.

One daemon serves the tests of this module in file order; the last one stops it and checks that
the drain left no socket, shm segment or semaphore. The dev key is made afresh (about 2 s at
2^10) in a temp param cache, so a key left by an older generator can never be reused.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.transport import frame
from cuzk_mp.errors import InputError
from tests.helpers import (
    DEFAULT_CIRCUITS, ENV, PY, REPO, DaemonProcess, free_port, check_proofs, config_text, parse_prometheus,
    raw_roundtrip, shm_leftovers, snarkjs_verify,
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    work = tmp_path_factory.mktemp("e2e")
    prefix = f"cuzk-e2e-{os.getpid()}"
    port = free_port()
    keys = tmp_path_factory.mktemp("keys")
    gen = '[circuits.gen]\nsynthetic = "porep-like"\nlog_n = 10\nkey_source = "device"\n'
    (work / "cuzk.toml").write_text(config_text(work, keys, prefix=prefix, status_port=port,
                                                circuits=DEFAULT_CIRCUITS + gen))
    d = DaemonProcess(work / "cuzk.toml", work)
    d.prefix, d.http = prefix, f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        ready = subprocess.run([str(REPO / "scripts" / "wait-ready.sh"), "--connect", d.addr,
                                "--timeout", "300"], env=ENV, capture_output=True, text=True,
                               timeout=320)
        assert ready.returncode == 0, ready.stderr + d.log()
        yield d
    finally:
        d.kill()


def wtns_inputs(out: Path, seeds: list[int]) -> list[Path]:
    """Witness files of the 2^10 porep-like circuit (what a client may send as .wtns)."""
    from cuzk_mp.circuits.synthetic_kinds import write_synthetic

    paths = []
    for s in seeds:
        _, wtns = write_synthetic("porep-like", 10, out / f"s{s}", seed=s, partition=0)
        paths.append(wtns.rename(out / f"seed{s}.wtns"))
    return paths


def test_prove_verifies_and_the_cli_writes_snarkjs_files(daemon: DaemonProcess,
                                                         tmp_path: Path) -> None:
    with daemon.client() as c:
        r = c.prove("syn", synthetic_partitions(2), timeout_s=120)
        assert r.state == "done" and not r.timed_out and r.error is None, r
        vk = c.verification_key("syn")
    check_proofs(vk, r)
    assert {"synthesis", "device", "total"} <= set(r.partitions[0].timings)
    out = tmp_path / "out"
    cli = subprocess.run([*PY, "client", "prove", "--connect", daemon.addr, "--circuit", "syn",
                          "--out", str(out)], env=ENV, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["state"] == "done"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["proof_0.json", "proof_1.json", "public_0.json", "public_1.json",
                     "verification_key.json"]
    for i in range(2):
        ok = subprocess.run([*PY, "groth16", "verify", str(out / "verification_key.json"),
                             str(out / f"public_{i}.json"), str(out / f"proof_{i}.json")],
                            env=ENV, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and "OK!" in ok.stdout


def test_a_key_generated_in_the_provers(daemon: DaemonProcess) -> None:
    """key_source "device": no key file in the param cache, the vk comes from the provers, proofs verify
    with it (ours and snarkjs, in check_proofs) and not with the file key's vk of the same circuit."""
    with daemon.client() as c:
        r = c.prove("gen", synthetic_partitions(1), timeout_s=120)
        assert r.state == "done" and r.error is None, r
        vk = c.verification_key("gen")
        other = c.verification_key("syn")
    check_proofs(vk, r)
    assert vk != other
    with pytest.raises(AssertionError):
        check_proofs(other, r)


def test_submit_then_await_with_and_without_timeout(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sub = c.submit("syn", synthetic_partitions(2, first_seed=10))
        t0 = time.perf_counter()
        early = c.await_proof(sub.job_id, timeout_s=0.05)
        assert early.timed_out and early.state in ("queued", "running")
        assert time.perf_counter() - t0 < 5
        r = c.await_proof(sub.job_id)
        assert r.state == "done" and not r.timed_out
        again = c.await_proof(sub.job_id, timeout_s=0)
        assert again.state == "done" and [p.proof for p in again.partitions] == [
            p.proof for p in r.partitions]


def _engine_counter(text: str, name: str) -> float:
    return parse_prometheus(text)[(f"cuzk_engine_{name}_total", ())]


def test_duplicate_request_ids_return_the_same_job(daemon: DaemonProcess) -> None:
    async def run() -> list[Any]:
        async with await AsyncClient.connect(daemon.addr) as c:
            before = await c.metrics()
            parts = synthetic_partitions(1, first_seed=99)
            subs = await asyncio.gather(*[c.submit("syn", parts, request_id="dup-1")
                                          for _ in range(4)])
            reply = await c.await_proof("dup-1", timeout_s=120)
            late = await c.prove("syn", parts, request_id="dup-1", timeout_s=120)
            with pytest.raises(InputError, match="different job"):
                await c.submit("syn", synthetic_partitions(1), request_id="dup-1")
            return [subs, reply, late, before, await c.metrics(), await c.status()]

    subs, reply, late, before, after, status = asyncio.run(run())
    assert {s.job_id for s in subs} == {"dup-1"} and [s.duplicate for s in subs].count(False) == 1
    assert reply.state == "done" and late.partitions[0].proof == reply.partitions[0].proof
    assert len([j for j in status["jobs"] if j["job_id"] == "dup-1"]) == 1
    for counter in ("jobs_submitted", "partitions_proved"):
        assert _engine_counter(after, counter) - _engine_counter(before, counter) == 1


def test_priorities_are_observed_in_completion_order(daemon: DaemonProcess) -> None:
    """Priority beats age, age breaks ties: checked on completion order.

    The blocker (many normal partitions) is submitted first; the others follow one at a time,
    each after the previous one is acknowledged, in an order where FIFO and priority disagree:
    ``low`` comes before ``normal`` and both come before ``crit`` and ``high``. Submitting them
    concurrently made the outcome depend on which journal write finished first (a HIGH job that
    reached the engine before the CRITICAL one rightly started first). ``crit`` goes before
    ``high`` so that their relative order is fixed whichever way the worker's next pick falls.
    """
    async def run() -> tuple[dict[str, Any], float]:
        async with await AsyncClient.connect(daemon.addr) as c:
            order = [("blocker", "syn", None, 24), ("low", "syn", "LOW", 1),
                     ("normal", "syn", None, 1), ("crit", "crit", None, 1),
                     ("high", "syn", "HIGH", 1)]
            subs = []
            for i, (_, cid, prio, n) in enumerate(order):
                subs.append(await c.submit(cid, synthetic_partitions(n, first_seed=100 + i),
                                           priority=prio))
            all_queued = time.time()
            done = await asyncio.gather(*[c.await_proof(s.job_id, timeout_s=300) for s in subs])
            return {name: r for (name, *_), r in zip(order, done)}, all_queued

    r, all_queued = asyncio.run(run())
    assert all(x.state == "done" for x in r.values())
    assert r["crit"].priority == "CRITICAL" and r["low"].priority == "LOW"
    t = {k: v.finished_at for k, v in r.items()}
    # Precondition: the blocker was still proving when the last job was queued; otherwise the
    # order below would say nothing about priorities.
    assert t["blocker"] > all_queued, ("the blocker finished before every job was queued", t)
    assert t["crit"] < t["high"] < t["blocker"] < t["normal"] < t["low"], t


def _wait_partition_done(c: Any, job_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.await_proof(job_id, timeout_s=0.1)
        if any(p.state == "done" for p in r.partitions) or r.state != "queued" and not r.timed_out:
            return r
    raise TimeoutError(job_id)


def test_cancel_a_queued_and_a_running_job(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        running = c.submit("syn", synthetic_partitions(8, first_seed=200))
        queued = c.submit("syn", synthetic_partitions(2, first_seed=300), priority="LOW")
        cq = c.cancel(queued.job_id)
        assert cq.cancelled
        rq = c.await_proof(queued.job_id, timeout_s=30)
        assert rq.state == "cancelled" and all(p.state == "cancelled" for p in rq.partitions)
        mid = _wait_partition_done(c, running.job_id)
        assert mid.state == "running"
        assert c.cancel(running.job_id).cancelled
        rr = c.await_proof(running.job_id, timeout_s=60)
        assert rr.state == "cancelled" and rr.error_kind == "Cancelled"
        states = [p.state for p in rr.partitions]
        assert "done" in states and "cancelled" in states, states
        assert not c.cancel(running.job_id).cancelled
        after = c.prove("syn", synthetic_partitions(1, first_seed=400), timeout_s=120)
        assert after.state == "done"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            st = c.status()
            if all(s["state"] == "free" for s in st["ring"]["slots"]):
                break
            time.sleep(0.1)
        assert all(s["state"] == "free" for s in st["ring"]["slots"]), st["ring"]
        assert st["engine"]["queue"] == {"pending": 0, "in_flight": 0}


def test_preload_and_evict(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        assert c.preload("crit").seconds >= 0
        srs = [e for e in c.status()["srs"] if e["circuit"] == "crit"]
        assert srs and all(e["bytes"] > 0 and e["tier"] for e in srs), srs
        busy = c.submit("crit", synthetic_partitions(4, first_seed=500))
        ev = c.evict("crit")
        assert not ev.evicted and ev.reason
        assert c.await_proof(busy.job_id, timeout_s=120).state == "done"
        assert c.evict("crit").evicted
        deadline = time.monotonic() + 10
        while [e for e in c.status()["srs"] if e["circuit"] == "crit" and e["tier"] != "disk"]:
            assert time.monotonic() < deadline, "evicted key still reported resident"
            time.sleep(0.1)
        assert [e["tier"] for e in c.status()["srs"] if e["circuit"] == "crit"] == ["disk"]
        assert c.prove("crit", synthetic_partitions(1), timeout_s=120).state == "done"


def test_status_and_metrics_over_http(daemon: DaemonProcess) -> None:
    base = daemon.http  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"{base}/status", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc["daemon"]["state"] == "running" and doc["engine"]["backend"] == "cpu"
    done = [j for j in doc["jobs"] if j["state"] == "done"]
    assert done and all(p["state"] == "done" and p["timings"]["total"] > 0
                        for p in done[0]["partitions"])
    roles = {p["role"] for p in doc["processes"]}
    assert {"synth", "prover"} <= roles and all(p["alive"] for p in doc["processes"])
    assert len(doc["ring"]["slots"]) == 2 and doc["memory"]["host_rss_bytes"] > 0
    assert doc["memory_budget"]["srs"] > 0
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        samples = parse_prometheus(resp.read().decode())
    assert samples[("cuzk_proofs_completed_total", (("circuit", "syn"),))] >= 10
    assert samples[("cuzk_jobs_finished_total", (("circuit", "syn"), ("state", "cancelled")))] == 2
    assert samples[("cuzk_job_duration_seconds_count", (("circuit", "syn"),))] >= 5
    assert samples[("cuzk_gpu_busy_seconds_total", (("device", "0"),))] > 0
    assert ("cuzk_queue_depth", ()) in samples and ("cuzk_ring_occupancy", ()) in samples
    assert samples[("cuzk_memory_bytes", (("kind", "host_rss"),))] > 0
    assert samples[("cuzk_engine_partitions_proved_total", ())] >= 10
    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b"ok\n"


def test_bad_frames_and_inputs_get_clear_errors(daemon: DaemonProcess, tmp_path: Path) -> None:
    path = daemon.addr[len("unix://"):]
    garbage = frame(b"\x92\x01\xc1not msgpack")
    typo = frame(msgspec.msgpack.encode({"type": "Prove", "id": 5, "circuit": "syn"}))
    replies = raw_roundtrip(path, [garbage, typo, frame(P.encode(P.GetMetrics(id=6)))])
    assert [r.kind for r in replies[:2]] == ["InputError", "InputError"] and replies[1].id == 5
    assert isinstance(replies[2], P.MetricsReply)
    replies = raw_roundtrip(path, [struct.pack(">I", 2**31) + b"junk"])
    assert replies[0].kind == "InputError" and "max_frame_bytes" in replies[0].message

    from cuzk_mp.formats.wtns import read_wtns, write_wtns
    good = wtns_inputs(tmp_path, [7])[0]
    w = read_wtns(good)
    w[w.shape[0] // 2] = np.array([12345, 0, 0, 0], dtype=np.uint64)
    bad_path = tmp_path / "unsat.wtns"
    write_wtns(bad_path, w)
    with daemon.client() as c:
        for parts, pattern in [
            ([P.PartitionIn("synthetic")], None),
            ([P.PartitionIn("json", b'{"in": 1}')], "no wasm"),
            ([P.PartitionIn("wtns", b"not a witness")], "not a .wtns"),
        ]:
            if pattern is None:
                with pytest.raises(InputError, match="unknown circuit"):
                    c.submit("no-such-circuit", parts)
            else:
                with pytest.raises(InputError, match=pattern):
                    c.submit("syn", parts)
        r = c.prove("syn", [P.PartitionIn("wtns", bad_path.read_bytes()),
                            P.PartitionIn("wtns", good.read_bytes())], timeout_s=120)
        assert r.state == "failed" and r.partitions[0].state == "failed"
        assert r.error_kind == "UnsatisfiedWitness", r
        assert "constraint" in (r.partitions[0].error or "")
        ok = c.prove("syn", [P.PartitionIn("wtns", good.read_bytes())], timeout_s=120)
        assert ok.state == "done"
        check_proofs(c.verification_key("syn"), ok)
    # the client CLI ends a job failed on its input with exit 2, as `groth16 prove` does
    cli = subprocess.run([*PY, "client", "prove", "--connect", daemon.addr, "--circuit", "syn", "--out",
                          str(tmp_path / "out"), str(bad_path)], env=ENV, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and json.loads(cli.stdout)["state"] == "failed", (cli.stdout, cli.stderr)


def test_a_request_over_the_daemons_frame_limit_is_refused_as_such(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A request larger than the daemon's max_frame_bytes (from a client that allows more: its default is
    128 MiB) is answered with the daemon's refusal, then the connection closed with the rest unread: the
    client reports that refusal (exit 2). Its write of the rest failed (a broken pipe), and it said it had
    lost the daemon, which "if it took the job" went on with it (exit 3), though no job was taken."""
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (5 << 20))  # the daemon's fixture takes 4 MiB frames
    with daemon.client() as c:
        with pytest.raises(InputError, match=r"frame of \d+ bytes exceeds max_frame_bytes \(4194304\)"):
            c.submit("syn", [P.PartitionIn("json", big.read_bytes())])
    for verb in ("submit", "prove"):
        out = ["--out", str(tmp_path / "out")] if verb == "prove" else []
        cli = subprocess.run([*PY, "client", verb, "--connect", daemon.addr, "--circuit", "syn", *out, str(big)],
                             env=ENV, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 2 and "exceeds max_frame_bytes (4194304)" in cli.stderr, (verb, cli.stderr)
        assert "goes on" not in cli.stderr, cli.stderr
    with daemon.client() as c:
        assert c.status()["daemon"]["state"] == "running"


def test_a_refused_input_file_is_named_by_the_client(daemon: DaemonProcess, tmp_path: Path) -> None:
    """``client submit|prove`` with input files: a file the daemon refuses at submit (an empty .wtns, one
    that is no witness) is named in the last line as the user gave it, with the daemon's reason, exit 2,
    as ``groth16 prove --connect`` names it; the line said "job X partitions[1].data", which the user
    had to map back to the second file."""
    good = wtns_inputs(tmp_path, [3])[0]
    empty = tmp_path / "empty.wtns"
    empty.write_bytes(b"")
    for verb in ("submit", "prove"):
        out = ["--out", str(tmp_path / "out")] if verb == "prove" else []
        cli = subprocess.run([*PY, "client", verb, "--connect", daemon.addr, "--circuit", "syn", *out, str(good),
                              str(empty)], env=ENV, capture_output=True, text=True, timeout=120)
        last = cli.stderr.strip().splitlines()[-1]
        assert cli.returncode == 2 and f"{empty}: not a .wtns file" in last, (verb, cli.stderr)
        assert "partitions[" not in last, last


def test_batch_prove_script(daemon: DaemonProcess, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    wtns_inputs(inputs, [1, 2, 3])
    multi = inputs / "two-partitions"
    multi.mkdir()
    for p in wtns_inputs(tmp_path, [4, 5]):
        p.rename(multi / p.name)
    for sub in inputs.glob("s*"):
        if sub.is_dir():
            for f in sub.iterdir():
                f.unlink()
            sub.rmdir()
    out = tmp_path / "out"
    cmd = [str(REPO / "scripts" / "batch-prove.sh"), "--connect", daemon.addr, "--circuit", "syn",
           "--out", str(out), "-j", "2", "--verify", str(inputs)]
    first = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("[ok]") == 4 and "4 of 4 jobs done" in first.stdout
    vk = json.loads((out / "seed1" / "verification_key.json").read_text())
    cases = [(json.loads((d / f"public_{i}.json").read_text()),
              json.loads((d / f"proof_{i}.json").read_text()))
             for d, n in [(out / "seed1", 1), (out / "seed2", 1), (out / "seed3", 1),
                          (out / "two-partitions", 2)] for i in range(n)]
    assert len(cases) == 5
    snarkjs_verify(vk, cases)
    again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("[skip]") == 4
    (inputs / "broken.wtns").write_bytes(b"wtns" + b"\0" * 64)
    third = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert third.returncode == 1 and "not done: broken" in third.stdout
    assert third.stdout.count("[skip]") == 4


def test_client_cli_verbs(daemon: DaemonProcess, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    from cuzk_mp.cli import main

    def cli(*argv: str) -> tuple[int, str]:
        rc = main(["client", argv[0], "--connect", daemon.addr, *argv[1:]])
        return rc, capsys.readouterr().out

    rc, out = cli("submit", "--circuit", "syn", "--partitions", "1", "--priority", "HIGH",
                  "--request-id", "cli-1")
    sub = json.loads(out)
    assert rc == 0 and sub["job_id"] == "cli-1" and sub["duplicate"] is False
    rc, out = cli("await", "cli-1", "--timeout", "120", "--out", str(tmp_path))
    assert rc == 0 and json.loads(out)["state"] == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "proof_0.json", "public_0.json", "verification_key.json"]
    rc, out = cli("cancel", "cli-1")
    assert rc == 0 and json.loads(out) == {"job_id": "cli-1", "cancelled": False, "state": "done"}
    rc, out = cli("status")
    assert rc == 0 and json.loads(out)["daemon"]["state"] == "running"
    rc, out = cli("metrics")
    assert rc == 0 and parse_prometheus(out)[("cuzk_jobs", (("state", "queued"),))] == 0
    rc, out = cli("ready")
    assert (rc, out) == (0, "running\n")
    rc, out = cli("preload", "syn")
    assert rc == 0 and json.loads(out)["circuit_id"] == "syn"
    rc, out = cli("evict", "--circuit", "syn")  # as submit and prove name it, too
    assert rc == 0 and json.loads(out)["evicted"] is True
    assert cli("evict")[0] == 2 and cli("preload", "syn", "--circuit", "syn")[0] == 2  # once, not twice
    assert cli("await", "no-such-job")[0] == 2
    assert cli("prove", "--circuit", "syn", "--out", str(tmp_path), "--partitions", "1",
               "--timeout", "0.001")[0] == 124
    assert main(["client", "status", "--connect", f"unix://{tmp_path}/nobody.sock"]) == 3


def test_a_client_whose_reader_leaves_early_says_nothing_of_the_daemon(daemon: DaemonProcess) -> None:
    """`client metrics | true` (a reader gone before the client writes): the closed pipe is
    stdout's, not the daemon's connection: no "lost the daemon" line, and the daemon serves on."""
    import shlex

    cmd = " ".join(shlex.quote(a) for a in [*PY, "client", "metrics", "--connect", daemon.addr])
    proc = subprocess.run(["sh", "-c", f"{cmd} | true"], env=ENV, capture_output=True, text=True, timeout=120)
    assert "lost the daemon" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    with daemon.client() as c:
        assert c.status()["daemon"]["state"] == "running"


def test_zz_sigterm_drains_and_cleans_up(daemon: DaemonProcess) -> None:
    sock = Path(daemon.addr[len("unix://"):])
    assert sock.exists()
    t0 = time.monotonic()
    assert daemon.terminate(timeout=60) == 0, daemon.log()
    assert time.monotonic() - t0 < 40
    assert not sock.exists()
    assert shm_leftovers(daemon.prefix) == []  # type: ignore[attr-defined]
    lines = [json.loads(x) for x in daemon.log().splitlines()
             if x.startswith("{") and '"logger": "cuzk_mp.daemon"' in x]
    assert any("[shutdown] stopped" in x["msg"] for x in lines)
    assert any("[start]" in x["msg"] and "serving on" in x["msg"] for x in lines)
