"""Protocol and job-table unit tests of the daemon, against an in-process engine double.

The double (:class:`tests.fake_engine.FakeEngine`) honours the engine contract's observable
behaviour. Its "proofs" are the generator points: these tests check the daemon's wire, job
lifecycle, journal, status and metrics, never proving (tests/test_daemon_e2e.py drives the real
engine).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cuzk_mp.algebra.field import G1_GEN
from cuzk_mp.daemon import config as C
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions
from cuzk_mp.daemon.handlers import DaemonState
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import frame, inproc_pair
from cuzk_mp.errors import ConfigError, InputError, ResourceError, Unavailable
from cuzk_mp.pipeline.supervisor import Degraded
from tests.fake_engine import FakeEngine, make_config, run_daemon
from tests.helpers import free_port, parse_prometheus, raw_roundtrip


def test_submit_await_prove_over_a_unix_socket(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            sub = await c.submit("syn", synthetic_partitions(2, first_seed=7))
            assert sub.state in ("queued", "running", "done") and not sub.duplicate
            r = await c.await_proof(sub.job_id, timeout_s=10)
            assert r.state == "done" and not r.timed_out and r.priority == "NORMAL"
            assert [p.public for p in r.partitions] == [["0", "7"], ["1", "8"]]
            assert r.partitions[0].proof["protocol"] == "groth16"
            assert r.partitions[0].proof["pi_a"][:2] == [str(G1_GEN[0]), str(G1_GEN[1])]
            r2 = await c.prove("crit", synthetic_partitions(1), timeout_s=10)
            assert r2.state == "done" and r2.priority == "CRITICAL"

    run_daemon(tmp_path, body)


def test_socket_is_private_and_removed_at_stop(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        st = os.stat(tmp_path / "d.sock")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600

    d = run_daemon(tmp_path, body)
    assert d.state is DaemonState.STOPPED and not (tmp_path / "d.sock").exists()


def test_await_timeout_is_real(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            sub = await c.submit("syn", synthetic_partitions(1))
            t0 = time.perf_counter()
            r = await c.await_proof(sub.job_id, timeout_s=0.3)
            waited = time.perf_counter() - t0
            assert r.timed_out and r.state == "queued" and 0.25 <= waited < 2.0
            assert r.partitions[0].state == "pending" and r.partitions[0].proof is None
            d.engine.gate.set()
            r = await c.await_proof(sub.job_id)
            assert r.state == "done" and not r.timed_out

    run_daemon(tmp_path, body)


def test_duplicate_request_ids(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            parts = synthetic_partitions(2)
            subs = await asyncio.gather(*[c.submit("syn", parts, request_id="porep-1000-7")
                                          for _ in range(5)])
            assert {s.job_id for s in subs} == {"porep-1000-7"}
            assert sum(not s.duplicate for s in subs) == 1
            with pytest.raises(InputError, match="different job"):
                await c.submit("syn", synthetic_partitions(3), request_id="porep-1000-7")
            d.engine.gate.set()
            r = await c.prove("syn", parts, request_id="porep-1000-7", timeout_s=10)
            assert r.state == "done"
            again = await c.submit("syn", parts, request_id="porep-1000-7")
            assert again.duplicate and again.state == "done"
        assert d.engine.submitted.count("porep-1000-7") == 1
        assert len(d.engine.proved) == 2

    run_daemon(tmp_path, body)


def test_priorities_and_cancel_of_a_queued_job(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            low = await c.submit("syn", synthetic_partitions(1), priority="LOW")
            normal = await c.submit("syn", synthetic_partitions(1))
            doomed = await c.submit("syn", synthetic_partitions(2), priority="HIGH")
            crit = await c.submit("crit", synthetic_partitions(1))
            cr = await c.cancel(doomed.job_id)
            assert cr.cancelled
            r = await c.await_proof(doomed.job_id, timeout_s=5)
            assert r.state == "cancelled" and {p.state for p in r.partitions} == {"cancelled"}
            assert not (await c.cancel(doomed.job_id)).cancelled
            d.engine.gate.set()
            for s in (low, normal, crit):
                assert (await c.await_proof(s.job_id, timeout_s=10)).state == "done"
        order = [j for j, _ in d.engine.proved]
        assert order == [crit.job_id, normal.job_id, low.job_id]

    run_daemon(tmp_path, body)


def test_errors_are_data_and_the_daemon_keeps_serving(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            cases = [
                (c.submit("nope", synthetic_partitions(1)), "unknown circuit 'nope'"),
                (c.submit("syn", []), "at least one partition"),
                (c.submit("syn", [P.PartitionIn("json", b'{"a": 1}')]), "has no wasm"),
                (c.submit("syn", [P.PartitionIn("wtns", b"junk")]), r"partitions\[0\].data"),
                (c.submit("syn", [P.PartitionIn("synthetic", seed=-1)]), "seed"),
                (c.await_proof("no-such-job"), "unknown job"),
                (c.cancel("no-such-job"), "unknown job"),
                (c.preload("nope"), "unknown circuit"),
                (c.await_proof("x", timeout_s=-1), "timeout_s"),
            ]
            for coro, pattern in cases:
                with pytest.raises(InputError, match=pattern):
                    await coro
            r = await c.prove("syn", synthetic_partitions(2), timeout_s=10)
            assert r.state == "done"
        status = await d.status_doc()
        assert status["daemon"]["state"] == "running"

    run_daemon(tmp_path, body)


def test_a_reply_of_a_newer_daemon_decodes_and_a_request_with_an_unknown_field_does_not() -> None:
    """Replies only ever gain fields (with defaults): a client ignores the ones it does not know, so a
    daemon (or a fleet box) of a newer version can answer it; requests stay strict."""
    part = {"index": 0, "state": "done", "proof": {"protocol": "groth16"}, "public": ["1"], "later": 1}
    raw = msgspec.msgpack.encode({"type": "JobReply", "id": 5, "job_id": "j", "circuit_id": "c", "state": "done",
                                  "priority": "NORMAL", "partitions": [part], "submitted_at": 1.0,
                                  "key_digest": "ab", "a_later_field": {"x": [1]}})
    reply = P.decode_reply(raw)
    assert isinstance(reply, P.JobReply)
    assert (reply.id, reply.key_digest, reply.partitions[0].public) == (5, "ab", ["1"])
    with pytest.raises(P.MalformedRequest, match="unknown field `admin`"):
        P.decode_request(msgspec.msgpack.encode({"type": "GetStatus", "id": 4, "admin": True}))
    with pytest.raises(P.MalformedRequest, match="unknown field"):
        P.decode_request(msgspec.msgpack.encode({"type": "SubmitProof", "id": 6, "circuit_id": "c", "partitions": [
            {"kind": "synthetic", "seed": 1, "weight": 2}]}))


def test_malformed_and_oversized_frames(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        path = str(tmp_path / "d.sock")
        good = frame(P.encode(P.GetMetrics(id=9)))
        wrong_type = frame(msgspec.msgpack.encode({"type": "SubmitProof", "id": 42}))
        garbage = frame(b"\xc1\xff\x00garbage")
        replies = await asyncio.to_thread(raw_roundtrip, path, [garbage, wrong_type, good], 5.0)
        assert [type(r).__name__ for r in replies] == ["ErrorReply", "ErrorReply", "MetricsReply"]
        assert replies[0].kind == "InputError" and "malformed" in replies[0].message
        assert replies[1].id == 42 and "circuit_id" in replies[1].message
        oversized = struct.pack(">I", 10 * 2**20) + b"x" * 100
        replies = await asyncio.to_thread(raw_roundtrip, path, [oversized, good], 5.0)
        assert len(replies) == 1 and replies[0].kind == "InputError"
        assert "max_frame_bytes" in replies[0].message
        async with await AsyncClient.connect(addr) as c:  # still serving
            assert "cuzk_requests_total" in await c.metrics()
            with pytest.raises(InputError, match="max_frame_bytes"):
                await c.submit("syn", [P.PartitionIn("wtns", b"wtns" + b"\0" * 70000)])

    run_daemon(tmp_path, body)


@pytest.mark.parametrize("over", ["unix", "tcp"])
def test_async_client_reports_the_refusal_of_a_request_over_the_frame_limit(
        tmp_path: Path, free_port: int, over: str) -> None:
    """A request larger than the daemon's max_frame_bytes (64 KiB here; the client allows 128 MiB) is
    answered with the daemon's refusal, then the connection closed with the rest of the request unread:
    the asyncio client reports that refusal, as the blocking one does, not the broken pipe of its write."""
    big = [P.PartitionIn("json", b" " * (8 << 20))]

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            with pytest.raises(InputError, match=r"frame of \d+ bytes exceeds max_frame_bytes \(65536\)"):
                await asyncio.wait_for(c.submit("syn", big), 30)
        async with await AsyncClient.connect(addr) as c:  # no job was taken, and the daemon serves on
            assert (await c.status())["job_counts"].get("queued", 0) == 0

    listen = f"unix://{tmp_path}/d.sock" if over == "unix" else f"127.0.0.1:{free_port}"
    run_daemon(tmp_path, body, listen=listen)


def test_pipelining_many_requests_on_one_connection(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            replies = await asyncio.gather(*[
                c.prove("syn", synthetic_partitions(1, first_seed=i), timeout_s=20)
                for i in range(40)])
            assert all(r.state == "done" for r in replies)
            assert sorted(r.partitions[0].public[1] for r in replies) == sorted(
                str(i) for i in range(40))
            assert len({r.job_id for r in replies}) == 40

    run_daemon(tmp_path, body)


def test_preload_evict_and_status(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            await c.preload("syn")
            st = await c.status()
            assert [(e["circuit"], e["tier"], e["bytes"]) for e in st["srs"]] == [("syn", "host", 1000)]
            d.engine.gate.clear()
            sub = await c.submit("syn", synthetic_partitions(1))
            ev = await c.evict("syn")
            assert not ev.evicted and "uses this circuit" in ev.reason
            st = await c.status()
            job = next(j for j in st["jobs"] if j["job_id"] == sub.job_id)
            assert job["state"] == "queued" and job["partitions"][0]["state"] == "queued"
            assert st["queue_depth"] == 1 and st["ring"]["slots"][1]["state"] == "ready"
            assert st["memory_budget"]["srs"] > 0 and st["processes"][0]["alive"]
            d.engine.gate.set()
            await c.await_proof(sub.job_id)
            assert (await c.evict("syn")).evicted
            assert (await c.status())["srs"] == []
            text = await c.metrics()
        assert 'cuzk_proofs_completed_total{circuit="syn"} 1' in text
        assert 'cuzk_ring_slots{state="ready"} 1' in text
        assert "cuzk_ring_occupancy 0.5" in text
        assert 'cuzk_memory_bytes{kind="host_rss"} 123' in text
        assert "cuzk_engine_partitions_proved_total 1" in text
            # (label order within braces is the exposition library's: compare parsed samples)
        samples = parse_prometheus(text)
        assert samples[("cuzk_engine_stage_seconds_bucket", (("le", "+Inf"), ("stage", "device")))] == 1

    run_daemon(tmp_path, body)


def test_results_are_pruned_after_ttl(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            r = await c.prove("syn", synthetic_partitions(1), request_id="r1", timeout_s=10)
            assert r.state == "done"
            assert await d.jobs.prune(now=time.monotonic()) == 0
            assert await d.jobs.prune(now=time.monotonic() + 61) == 1
            with pytest.raises(InputError, match="pruned"):
                await c.await_proof("r1")
            assert d.journal.load() == []
            again = await c.submit("syn", synthetic_partitions(1), request_id="r1")
            assert not again.duplicate

    run_daemon(tmp_path, body, result_ttl="60s")


def test_a_journal_that_cannot_be_written_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """A full disk (the journal's writes fail): a submit is refused (ResourceError, nothing left
    behind); a finished job's state is kept and written once the disk is back, pruning waits for
    the journal (a pruned job must not come back) and goes on afterwards; a restart then neither
    loses a result nor proves a finished job again."""
    import sqlite3

    from cuzk_mp.daemon.journal import Journal

    full = {"on": False}
    real = Journal._run

    async def flaky(self: Journal, fn: object, *args: object, **kw: object) -> object:
        if full["on"] and getattr(fn, "__name__", "") in ("_insert", "_finish", "_remove"):
            return await real(self, _raises, *args, **kw)
        return await real(self, fn, *args, **kw)

    def _raises(*_: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    ids: dict[str, str] = {}

    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            ids["old"] = (await c.prove("syn", synthetic_partitions(1), timeout_s=10)).job_id
            full["on"] = True
            with pytest.raises(ResourceError, match="journal .* cannot be written: database or disk is full"):
                await c.submit("syn", synthetic_partitions(1), request_id="refused")
            assert "refused" not in d.jobs.jobs
            full["on"] = False
            d.engine.gate.clear()
            ids["late"] = (await c.submit("syn", synthetic_partitions(1))).job_id
            full["on"] = True  # the disk fills while it runs: its final state cannot be written
            d.engine.gate.set()
            assert (await c.await_proof(ids["late"], timeout_s=10)).state == "done"
            await d.jobs.flush()
            with pytest.raises(ResourceError):  # nothing is pruned while the journal refuses
                await d.jobs.prune(now=time.monotonic() + 3600)
            assert ids["old"] in d.jobs.jobs and ids["late"] in d.jobs.jobs
            full["on"] = False
            assert await d.jobs.write_pending() == 0  # the next round writes the late job's state
            assert {e.job_id: e.state for e in d.journal.load()} == {ids["old"]: "done", ids["late"]: "done"}
            assert await d.jobs.prune(now=time.monotonic() + 3600) == 2
            assert d.journal.load() == []

    Journal._run = flaky  # type: ignore[method-assign]
    try:
        run_daemon(tmp_path, first, result_ttl="60s")
    finally:
        Journal._run = real  # type: ignore[method-assign]

    async def second(d: Daemon, addr: str) -> None:
        assert d.engine.submitted == []  # nothing proved again, nothing pruned came back
        assert d.jobs.jobs == {}

    run_daemon(tmp_path, second)


def test_a_result_is_given_out_only_once_the_journal_has_it(tmp_path: Path) -> None:
    """Between a job's end and its journal write a crash would run it again: no waiter may hold its
    proofs before that write (an await in that window waits, and times out as for a running job)."""
    import threading

    from cuzk_mp.daemon.journal import Journal

    gate = threading.Event()
    real = Journal._finish

    def held(self: Journal, job_id: str, reply: P.JobReply, partitions: list[Any]) -> None:
        gate.wait(30)
        real(self, job_id, reply, partitions)

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            job = (await c.submit("syn", synthetic_partitions(2))).job_id
            deadline = time.monotonic() + 10
            while d.jobs.jobs[job].state != "done" and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert d.jobs.jobs[job].state == "done"  # the engine is done with it; the journal is not
            r = await c.await_proof(job, timeout_s=0.3)
            assert r.timed_out and r.state == "running", r  # its partitions' proofs show as they come
            assert {e.job_id: e.state for e in d.journal.load()} == {job: "queued"}
            gate.set()
            r = await c.await_proof(job, timeout_s=10)
            assert r.state == "done" and not r.timed_out and all(p.proof for p in r.partitions)
            assert {e.job_id: e.state for e in d.journal.load()} == {job: "done"}

    Journal._finish = held  # type: ignore[method-assign]
    try:
        run_daemon(tmp_path, body)
    finally:
        gate.set()
        Journal._finish = real  # type: ignore[method-assign]


def test_a_job_that_ended_before_a_shutdown_gives_its_waiter_the_result(tmp_path: Path) -> None:
    """SIGTERM right after a job ended, its journal write still under way (a slow fsync): the shutdown
    waits for that write, and the job's waiter gets the proofs, not "shutting down ... resumes after a
    restart" for a job the journal then records as done."""
    from cuzk_mp.daemon.journal import Journal

    real = Journal._finish

    def slow(self: Journal, job_id: str, reply: P.JobReply) -> None:
        time.sleep(0.3)
        real(self, job_id, reply)

    got: dict[str, Any] = {}

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            job = (await c.submit("syn", synthetic_partitions(2))).job_id
            waiter = asyncio.ensure_future(c.await_proof(job, timeout_s=30))
            deadline = time.monotonic() + 10
            while d.jobs.jobs[job].state != "done" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            stop = asyncio.ensure_future(d.stop())
            got["reply"] = await waiter
            await stop

    Journal._finish = slow  # type: ignore[method-assign]
    try:
        run_daemon(tmp_path, body)
    finally:
        Journal._finish = real  # type: ignore[method-assign]
    r = got["reply"]
    assert r.state == "done" and all(p.proof for p in r.partitions), r


def test_exit_when_idle_waits_for_connections_and_jobs(tmp_path: Path) -> None:
    async def stops_within(d: Daemon, s: float) -> bool:
        t_end = time.monotonic() + s
        while time.monotonic() < t_end:
            if d._stop.is_set():
                return True
            await asyncio.sleep(0.05)
        return d._stop.is_set()

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:  # an open connection keeps it up
            sub = await c.submit("syn", synthetic_partitions(1))
            assert not await stops_within(d, 1.0)
        assert not await stops_within(d, 1.0)  # a queued job keeps it up
        d.engine.gate.set()
        async with await AsyncClient.connect(addr) as c:
            assert (await c.await_proof(sub.job_id, timeout_s=10)).state == "done"
        t0 = time.monotonic()
        assert await stops_within(d, 5.0)  # idle: it drains by itself
        assert time.monotonic() - t0 >= 0.3

    run_daemon(tmp_path, body, exit_when_idle="0.4s")


def test_exit_when_idle_is_refused_for_a_fleet_box(tmp_path: Path) -> None:
    raw = {"daemon": {"listen": f"unix://{tmp_path}/d.sock", "exit_when_idle": "5m"},
           "fleet": {"dsn": "postgresql://127.0.0.1/x"}, "circuits": {"syn": {"synthetic": "porep-like",
                                                                          "log_n": 10}}}
    with pytest.raises(ConfigError, match="exit_when_idle"):
        C.resolve(raw, base=tmp_path, source="t.toml")
    raw["daemon"]["exit_when_idle"] = 0
    assert C.resolve(raw, base=tmp_path, source="t.toml").exit_when_idle_s == 0


def test_journal_restores_results_and_resubmits_unfinished(tmp_path: Path) -> None:
    ids: dict[str, str] = {}

    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            ids["done"] = (await c.prove("syn", synthetic_partitions(2), timeout_s=10)).job_id
            d.engine.gate.clear()
            ids["open"] = (await c.submit("syn", synthetic_partitions(2, 5))).job_id
            ids["crit"] = (await c.submit("crit", synthetic_partitions(1))).job_id

    run_daemon(tmp_path, first)  # the stop "cancels" the open jobs in the engine: not final

    async def second(d: Daemon, addr: str) -> None:
        assert d.engine.submitted == [ids["open"], ids["crit"]]
        async with await AsyncClient.connect(addr) as c:
            r = await c.await_proof(ids["done"], timeout_s=1)
            assert r.state == "done" and len(r.partitions) == 2
            r = await c.await_proof(ids["open"], timeout_s=10)
            assert r.state == "done" and [p.public[1] for p in r.partitions] == ["5", "6"]
            assert (await c.await_proof(ids["crit"], timeout_s=10)).state == "done"

    run_daemon(tmp_path, second)


def test_a_restored_job_whose_circuit_is_gone_fails_and_is_counted(tmp_path: Path) -> None:
    ids: list[str] = []

    async def first(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            ids.extend([(await c.submit("extra", synthetic_partitions(1))).job_id for _ in range(3)])

    run_daemon(tmp_path, first, circuits={"extra": {"synthetic": "porep-like", "log_n": 10}})

    async def second(d: Daemon, addr: str) -> None:  # "extra" is no longer configured
        async with await AsyncClient.connect(addr) as c:
            for job_id in ids:
                r = await c.await_proof(job_id, timeout_s=1)
                assert r.state == "failed" and "'extra' is no longer configured" in (r.error or "")
        text = await d.metrics_text()
        assert 'cuzk_jobs_finished_total{circuit="extra",state="failed"} 3' in text, text

    run_daemon(tmp_path, second)


def test_sync_client_and_shutdown_refusals(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        def sync_calls() -> None:
            with Client(addr) as c:
                r = c.prove("syn", synthetic_partitions(1), timeout_s=10)
                assert r.state == "done"
                assert c.status()["job_counts"]["done"] == 1
                with pytest.raises(InputError):
                    c.cancel("missing")
        await asyncio.to_thread(sync_calls)
        d.jobs.draining = True
        async with await AsyncClient.connect(addr) as c:
            with pytest.raises(Unavailable, match="shutting down"):  # exit 3: try later or elsewhere
                await c.submit("syn", synthetic_partitions(1))
        from cuzk_mp.cli import exit_code
        assert exit_code(Unavailable("the daemon is shutting down"))[0] == 3

    run_daemon(tmp_path, body)


def test_job_counts_and_the_metric_agree_with_the_job_list(tmp_path: Path) -> None:
    """A queued job whose first partition the engine has started is running in the job list, in
    ``job_counts`` and in the ``cuzk_jobs`` gauge alike (not only once a partition finishes)."""
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()  # nothing finishes
        try:
            async with await AsyncClient.connect(addr) as c:
                started = (await c.submit("syn", synthetic_partitions(2))).job_id
                waiting = (await c.submit("syn", synthetic_partitions(1))).job_id
                d.engine.live[(started, 0)] = "proving"
                doc = (await c.status())
                shown = {j["job_id"]: j["state"] for j in doc["jobs"]}
                assert shown == {started: "running", waiting: "queued"}
                assert (doc["job_counts"]["running"], doc["job_counts"]["queued"]) == (1, 1)
                gauge = parse_prometheus(await c.metrics())
                assert gauge[("cuzk_jobs", (("state", "running"),))] == 1
                assert gauge[("cuzk_jobs", (("state", "queued"),))] == 1
        finally:
            d.engine.gate.set()

    run_daemon(tmp_path, body)


def test_replies_fit_max_frame_bytes(tmp_path: Path) -> None:
    """With max_frame_bytes = 64 KiB: a job whose proofs could not come back in one reply is
    refused at submit, naming the most that fit; a status document larger than a frame is cut to
    the jobs that fit (running first), saying how many were left out, and still answers ready."""
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            with pytest.raises(InputError, match=r"a job of 60 partitions .* max_frame_bytes = 65536: submit at "
                                                 r"most 46 partitions"):
                await c.submit("syn", synthetic_partitions(60))
            for _ in range(30):
                await c.prove("syn", synthetic_partitions(40), timeout_s=30)
            d.engine.gate.clear()
            try:
                live = (await c.submit("syn", synthetic_partitions(2))).job_id
                doc = await c.status()
                assert doc["daemon"]["state"] == "running" and doc["job_counts"]["done"] == 30
                assert doc["jobs_left_out"] > 0 and len(doc["jobs"]) + doc["jobs_left_out"] == 31
                assert doc["jobs"][0]["job_id"] == live  # the running job is kept
            finally:
                d.engine.gate.set()

    run_daemon(tmp_path, body)


def test_a_tiny_frame_still_answers_ready(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            doc = await c.status()
            assert doc["daemon"] == {"state": "running"} and "job_counts" in doc and "left_out" in doc

    # the least frame the config takes, and circuits enough that the document without jobs is larger
    many = {f"c{i}": {"synthetic": "porep-like", "log_n": 10} for i in range(20)}
    run_daemon(tmp_path, body, circuits=many, max_frame_bytes=P.job_reply_bytes(1))


def test_healthz_answers_while_the_journal_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The status server, started before the journal, answers /healthz (503 "starting") while the journal
    opens (its WAL check reads the whole WAL): the open ran on the event loop, and a probe got no answer
    until it ended."""
    import threading
    import urllib.error
    import urllib.request

    from cuzk_mp.daemon.journal import Journal

    port = free_port()
    opening, opened = threading.Event(), threading.Event()
    real_open = Journal.open

    def slow_open(path: Path) -> Journal:
        opening.set()
        opened.wait(10)  # a WAL check that takes a while, until the probe below has its answer
        return real_open(path)

    monkeypatch.setattr(Journal, "open", slow_open)

    def probe() -> tuple[int, str] | str:
        try:
            assert opening.wait(10)
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return "answered 200 while starting"
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return f"no answer: {e}"
        finally:
            opened.set()

    async def main() -> tuple[int, str] | str:
        d = Daemon(make_config(tmp_path, status_listen=f"127.0.0.1:{port}"), engine_factory=FakeEngine)
        answer, _ = await asyncio.gather(asyncio.to_thread(probe), d.start())
        await d.stop()
        return answer

    assert asyncio.run(main()) == (503, "starting\n")


def test_http_status_metrics_healthz(tmp_path: Path) -> None:
    import urllib.request

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def body(d: Daemon, addr: str) -> None:
        def get(path: str) -> tuple[int, str, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.headers["Content-Type"], r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers["Content-Type"], e.read().decode()

        async with await AsyncClient.connect(addr) as c:
            await c.prove("syn", synthetic_partitions(2), timeout_s=10)
        code, ctype, text = await asyncio.to_thread(get, "/status")
        doc = json.loads(text)
        assert code == 200 and ctype == "application/json"
        assert doc["job_counts"]["done"] == 1 and doc["jobs"][0]["partitions"][1]["state"] == "done"
        code, ctype, text = await asyncio.to_thread(get, "/metrics")
        assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert 'cuzk_jobs_finished_total{circuit="syn",state="done"} 1' in text
        assert await asyncio.to_thread(get, "/healthz") == (200, "text/plain", "ok\n")
        assert (await asyncio.to_thread(get, "/nope"))[0] == 404

        def other(method: str, raw: bytes | None = None) -> tuple[int, bytes]:
            import http.client
            if raw is not None:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(raw)
                    return int(s.recv(100).split()[1]), b""
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request(method, "/healthz")
            resp = conn.getresponse()
            return resp.status, resp.read()

        assert await asyncio.to_thread(other, "HEAD") == (200, b"")
        assert (await asyncio.to_thread(other, "POST"))[0] == 405
        assert (await asyncio.to_thread(other, "", b"NONSENSE\r\n\r\n"))[0] == 400

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")


def test_http_status_401_names_the_scheme_and_403_does_not(tmp_path: Path) -> None:
    """A 401 carries WWW-Authenticate (RFC 9110), naming the bearer scheme /status reads its token by;
    a token that is sent but unknown is a 403 (no challenge: another try of the same will not do)."""
    import urllib.error
    import urllib.request

    port = free_port()

    def get(path: str, token: str | None = None, method: str = "GET") -> tuple[int, str | None]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.headers["WWW-Authenticate"]
        except urllib.error.HTTPError as e:
            return e.code, e.headers["WWW-Authenticate"]

    async def body(d: Daemon, addr: str) -> None:
        for method in ("GET", "HEAD"):
            assert await asyncio.to_thread(get, "/status", None, method) == (401, 'Bearer realm="cuzk-mp"')
        assert await asyncio.to_thread(get, "/status", "y" * 20) == (403, None)
        assert await asyncio.to_thread(get, "/status?detail=1", "t" * 20) == (403, None)
        assert await asyncio.to_thread(get, "/status", "t" * 20) == (200, None)

    run_daemon(tmp_path, body, tokens=["t" * 20], status_listen=f"127.0.0.1:{port}")


def test_a_client_aimed_at_the_status_port_is_told_so_and_exits_3(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The HTTP server answers a frame with "HTTP/1.1 400 ...": those four bytes are no frame's length
    (1.2 GB) but an address that is not the daemon's protocol socket: exit 3 (the daemon was not
    reached), the message saying it answers HTTP; the blocking, asyncio and one-proof clients alike."""
    from cuzk_mp import cli
    from cuzk_mp.daemon import status_http
    from cuzk_mp.daemon.prove_files import Unreachable, prove_to_files
    from cuzk_mp.daemon.transport import NotTheProtocol

    monkeypatch.setattr(status_http, "HEAD_TIMEOUT_S", 0.2)  # a frame has no blank line: answered at the timeout
    port = free_port()
    http = f"127.0.0.1:{port}"

    async def body(d: Daemon, addr: str) -> None:
        assert await asyncio.to_thread(cli.main, ["client", "status", "--connect", http]) == cli.EXIT_UNREACHABLE
        with pytest.raises(NotTheProtocol, match="answers HTTP"):
            with Client(http) as c:
                await asyncio.to_thread(c.status)
        with pytest.raises(NotTheProtocol, match="answers HTTP"):
            async with await AsyncClient.connect(http) as ac:
                await ac.status()
        with pytest.raises(Unreachable, match=f"cannot reach the daemon at {http}: it answers HTTP"):
            await asyncio.to_thread(prove_to_files, http, "", "syn", tmp_path / "k.zkey", tmp_path / "w.wtns",
                                    synthetic_partitions(1)[0], tmp_path / "p.json", tmp_path / "q.json")

    run_daemon(tmp_path, body, status_listen=http)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"cuzk-mp client: cannot reach the daemon at {http}: it answers HTTP")
    assert "status_listen" in line and "frame of" not in line


def test_inproc_transport_carries_frames_and_enforces_the_limit() -> None:
    async def main() -> None:
        a, b = inproc_pair(max_frame_bytes=100)
        await a.write(b"hello")
        assert await b.read() == b"hello"
        with pytest.raises(Exception, match="max_frame_bytes"):
            await a.write(b"x" * 101)
        a.close()
        with pytest.raises(ConnectionError):
            await b.read()

    asyncio.run(main())


def test_tcp_listener_and_a_reply_too_big_for_a_frame(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = C.resolve({"daemon": {"listen": f"127.0.0.1:{port}", "max_frame_bytes": "4KiB",
                                "status_listen": f"unix://{tmp_path}/status.sock"},
                     "srs": {"param_cache": str(tmp_path / "cache")},
                     "memory": {"total_budget": "64GiB"},
                     "circuits": {"syn": {"synthetic": "porep-like", "log_n": 10}}},
                    base=tmp_path)

    async def main() -> None:
        d = Daemon(cfg, engine_factory=FakeEngine)
        await d.start()
        assert stat.S_IMODE(os.stat(tmp_path / "status.sock").st_mode) == 0o600
        try:
            async with await AsyncClient.connect(f"127.0.0.1:{port}") as c:
                r = await c.prove("syn", synthetic_partitions(1), timeout_s=10)
                assert r.state == "done"
                for i in range(30):
                    await c.prove("syn", synthetic_partitions(1, first_seed=i), timeout_s=10)
                doc = await c.status()  # 31 jobs with proofs do not fit in 4 KiB: cut to those that do
                assert doc["jobs_left_out"] > 0 and doc["job_counts"]["done"] == 31
                with pytest.raises(InputError, match="max_frame_bytes = 4096: submit at most 2 partitions"):
                    await c.prove("syn", synthetic_partitions(3), timeout_s=10)
                assert not (await c.cancel(r.job_id)).cancelled  # the connection still serves
        finally:
            await d.stop()
        assert not (tmp_path / "status.sock").exists()

    asyncio.run(main())


def test_degraded_engine_is_reported_everywhere(tmp_path: Path, free_port: int) -> None:
    """A role that keeps dying: /healthz 503 naming the cause, GetStatus and the metrics say why."""
    import urllib.error
    import urllib.request

    cause = "no prover process is running: cuzk-prover-0 died 3 times in a row before READY (last: exit code 3)"

    async def body(d: Daemon, addr: str) -> None:
        def healthz() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{free_port}/healthz", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        assert await asyncio.to_thread(healthz) == (200, "ok\n")
        d.engine.degraded_roles = [Degraded("prover", cause, time.time())]
        code, text = await asyncio.to_thread(healthz)
        assert code == 503 and text.startswith("degraded: ") and cause in text
        async with await AsyncClient.connect(addr) as c:
            st = await c.status()
            samples = parse_prometheus(await c.metrics())
        assert st["daemon"]["state"] == "running"
        assert st["engine"]["degraded"][0]["role"] == "prover" and st["engine"]["degraded"][0]["reason"] == cause
        assert samples[("cuzk_degraded", (("role", "prover"),))] == 1
        assert samples[("cuzk_degraded", (("role", "synth"),))] == 0
        d.engine.degraded_roles = []
        assert await asyncio.to_thread(healthz) == (200, "ok\n")

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{free_port}")


def test_metrics_are_prometheus_client_families(tmp_path: Path) -> None:
    """One stage histogram, counters for what only grows, labels instead of names, build_info."""
    import platform

    from cuzk_mp import __version__

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            await c.prove("syn", synthetic_partitions(2), timeout_s=10)
            text = await c.metrics()
        samples = parse_prometheus(text)
        assert "# TYPE cuzk_engine_stage_seconds histogram" in text and text.count(" histogram\n") == 3
        assert samples[("cuzk_engine_stage_seconds_count", (("stage", "device"),))] == 2
        assert not [k for k in samples if k[0].startswith("cuzk_partition_stage")]  # one stage histogram
        assert samples[("cuzk_build_info", (("python", platform.python_version()), ("version", __version__)))] == 1
        assert samples[("cuzk_engine_process_restarts_total", (("role", "prover"),))] == 0
        assert samples[("cuzk_engine_jobs_finished_total", (("state", "done"),))] == 0
        assert samples[("cuzk_process_memory_bytes", (("kind", "uss"), ("process", "engine")))] == 50
        assert all(len(line.split(" ", 3)) == 4 for line in text.splitlines() if line.startswith("# HELP"))
        assert not [k for k in samples if k[0].endswith("_created")]

    run_daemon(tmp_path, body)


def test_client_out_on_a_full_disk_writes_each_proof_with_its_public_signals_or_neither(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``client prove --out DIR`` where the disk fills while public_1.json is written: proof_1.json is not
    left alone, the job's summary is still printed, and the last line names the file and how to get the
    files again (exit 2, as for any output that cannot be written)."""
    from contextlib import contextmanager

    from cuzk_mp import cli
    from cuzk_mp.formats import atomic

    real = atomic.atomic_output

    class FullDisk:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @contextmanager
    def full_at_public_1(path: Any, mode: str = "wb") -> Any:
        with real(path, mode) as f:
            yield FullDisk() if Path(path).name == "public_1.json" else f

    monkeypatch.setattr(atomic, "atomic_output", full_at_public_1)
    out = tmp_path / "out"

    async def body(d: Daemon, addr: str) -> None:
        argv = ["client", "prove", "--connect", addr, "--circuit", "syn", "--partitions", "3", "--out", str(out)]
        assert await asyncio.to_thread(cli.main, argv) == 2

    run_daemon(tmp_path, body)
    names = sorted(p.name for p in out.iterdir())
    assert "proof_1.json" not in names and not any(n.startswith(".") for n in names), names
    assert {"proof_0.json", "public_0.json"} <= set(names)
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["state"] == "done" and len(summary["partitions"]) == 3
    last = captured.err.strip().splitlines()[-1]
    assert f"{out / 'public_1.json'}: cannot write it: No space left on device" in last, last
    assert f"cuzk-mp client await {summary['job_id']} --out DIR" in last


def test_a_finished_job_keeps_its_reply_not_its_input_bytes(tmp_path: Path) -> None:
    """A job's witness bytes (many MB in production) are needed until it ends, not after: the daemon's
    record and the journal row keep only each partition's kind and seed, a repeated request still finds
    the job by its digest, and a restart still serves its reply."""
    from tests.helpers import small_circom_key

    zkey, r1cs = small_circom_key(tmp_path)
    circuits = {"circ": {"zkey": str(zkey), "r1cs": str(r1cs)}}
    witness = b"wtns" + bytes(40_000)
    journal = tmp_path / "journal.sqlite"
    job: list[str] = []

    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            sub = await c.submit("circ", [P.PartitionIn("wtns", witness)], request_id="req-1")
            job.append(sub.job_id)
            assert (await c.await_proof(sub.job_id, timeout_s=30)).state == "done"
            assert [p.data for p in d.jobs.jobs[sub.job_id].partitions] == [b""]
            (row,) = [e for e in d.journal.load() if e.job_id == sub.job_id]
            assert row.state == "done" and [(p.kind, p.data) for p in row.partitions] == [("wtns", b"")]
            again = await c.submit("circ", [P.PartitionIn("wtns", witness)], request_id="req-1")
            assert again.job_id == sub.job_id and again.duplicate

    async def second(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            r = await c.await_proof(job[0], timeout_s=5)
            assert r.state == "done" and all(p.proof for p in r.partitions)

    run_daemon(tmp_path, first, circuits=circuits, journal=str(journal))
    run_daemon(tmp_path, second, circuits=circuits, journal=str(journal))


def test_a_synthetic_partition_with_data_is_refused(tmp_path: Path) -> None:
    """A synthetic partition is its seed: bytes sent with it would be kept and journaled for nothing
    (MBs a job, from any client), so the submit is refused naming them."""
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            with pytest.raises(InputError, match=r"partitions\[1\]\.data: a synthetic partition takes a seed, no "
                                                 r"data \(4096 bytes given\)"):
                await c.submit("syn", [P.PartitionIn("synthetic", seed=1), P.PartitionIn("synthetic", bytes(4096), 2)])
            assert d.engine.submitted == []

    run_daemon(tmp_path, body)
