"""The daemon's bounded queue: ``[daemon] max_queued_jobs``, ``max_queued_input`` and ``max_jobs_per_owner``.

Until a job finishes its input bytes stay in the daemon's memory, so a submit beyond a cap is refused
with Unavailable (the client's exit 3: send it again later under the same request id) naming the cap,
and taken again once jobs have finished; a repeat of a job the daemon has is answered whatever the caps,
and jobs restored from the journal count without being refused. The daemon runs around the engine
double (tests/fake_engine.py), whose ``gate`` holds the jobs queued.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp import cli
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.jobs import JobTable
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.errors import InputError, Unavailable
from tests.fake_engine import FakeEngine, make_config, run_daemon
from tests.helpers import small_circom_key, wait_until

TENANT_A = "tenant-a-token-00001"
TENANT_B = "tenant-b-token-00002"


def scanned(jobs: JobTable, owner: str | None = None) -> tuple[int, int]:
    """The unfinished journaled jobs and their input bytes, counted the slow way: what the running
    counters (``JobTable.queued``) must always equal."""
    recs = [r for r in jobs.jobs.values() if r.state in ("queued", "running") and jobs.journaled(r.job_id)
            and (owner is None or r.owner == owner)]
    return len(recs), sum(len(p.data) for r in recs for p in r.partitions)


def witness(size: int) -> list[P.PartitionIn]:
    """One .wtns partition of ``size`` bytes (the engine double checks only its magic)."""
    return [P.PartitionIn("wtns", b"wtns" + bytes(size - 4))]


def circom(tmp_path: Path) -> dict[str, Any]:
    zkey, r1cs = small_circom_key(tmp_path)
    return {"circ": {"zkey": str(zkey), "r1cs": str(r1cs)}}


def test_submits_beyond_max_queued_jobs_wait_until_a_job_finishes(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()  # nothing finishes
        async with await AsyncClient.connect(addr) as c:
            first = await c.submit("syn", synthetic_partitions(1), request_id="job-1")
            with pytest.raises(InputError, match="synthetic partition takes a seed"):  # refused by the engine:
                await c.submit("syn", [P.PartitionIn("synthetic", b"x", 1)])  # it holds no place
            doomed = await c.submit("syn", synthetic_partitions(1))
            assert d.jobs.queued() == scanned(d.jobs) == (2, 0)
            with pytest.raises(Unavailable) as refused:
                await c.submit("syn", synthetic_partitions(1), request_id="job-3")
            assert str(refused.value) == (
                "the daemon holds 2 unfinished jobs (queued or running), its cap ([daemon] max_queued_jobs = 2); "
                "send it again once some jobs have finished")
            again = await c.submit("syn", synthetic_partitions(1), request_id="job-1")  # a repeat is answered
            assert again.duplicate and again.job_id == first.job_id
            # the command line: exit 3 ("takes no requests now"), the cap named
            code = await asyncio.to_thread(cli.main, ["client", "submit", "--connect", addr, "--circuit", "syn",
                                                      "--partitions", "1", "--request-id", "job-3"])
            assert code == cli.EXIT_UNREACHABLE == 3
            assert "[daemon] max_queued_jobs = 2" in capsys.readouterr().err
            st = await c.status()
            assert st["queue"] == {"jobs": 2, "input_bytes": 0, "max_queued_jobs": 2,
                                   "max_queued_input": 2 << 30, "max_jobs_per_owner": 0}
            assert (await c.cancel(doomed.job_id)).cancelled  # a cancelled job gives its place back
            await c.await_proof(doomed.job_id, timeout_s=5)
            assert d.jobs.queued() == scanned(d.jobs) == (1, 0)
            third = await c.submit("syn", synthetic_partitions(1), request_id="job-3")
            assert not third.duplicate
            with pytest.raises(Unavailable, match="max_queued_jobs = 2"):
                await c.prove("crit", synthetic_partitions(1), timeout_s=5)  # Prove takes the same door
            d.engine.gate.set()
            for job_id in (first.job_id, third.job_id):
                assert (await c.await_proof(job_id, timeout_s=10)).state == "done"
            assert d.jobs.queued() == scanned(d.jobs) == (0, 0)
            assert (await c.prove("crit", synthetic_partitions(1), timeout_s=10)).state == "done"

    run_daemon(tmp_path, body, max_queued_jobs=2)
    assert cli.exit_code(Unavailable("x"))[0] == 3


def test_the_byte_cap_counts_the_witnesses_the_unfinished_jobs_hold(tmp_path: Path) -> None:
    size = 40_000

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            # an empty daemon takes any job: this one's 150 kB are more than the cap
            big = await c.submit("circ", witness(150_000))
            with pytest.raises(Unavailable, match=r"^the daemon holds 1 unfinished job with 146 KiB \(150000 bytes\) "
                                                  r"of inputs .* max_queued_input = 98 KiB, 100000 bytes\)"):
                await c.submit("circ", witness(1000))
            d.engine.gate.set()
            assert (await c.await_proof(big.job_id, timeout_s=10)).state == "done"
            assert d.jobs.queued() == (0, 0)
            d.engine.gate.clear()
            subs = [await c.submit("circ", witness(size)) for _ in range(2)]
            assert d.jobs.queued() == scanned(d.jobs) == (2, 2 * size)
            with pytest.raises(Unavailable) as refused:
                await c.submit("circ", witness(size))
            assert str(refused.value) == (
                f"the daemon holds 2 unfinished jobs with 78 KiB ({2 * size} bytes) of inputs and this job brings "
                f"39 KiB ({size} bytes): more than its cap ([daemon] max_queued_input = 98 KiB, 100000 bytes); send it "
                "again once some jobs have finished")
            small = await c.submit("circ", witness(20_000))  # what still fits is taken
            assert d.jobs.queued() == scanned(d.jobs) == (3, 2 * size + 20_000)
            text = await d.metrics_text()
            assert f"cuzk_queued_input_bytes {float(2 * size + 20_000)}" in text, text
            d.engine.gate.set()
            for job_id in [s.job_id for s in subs] + [small.job_id]:
                assert (await c.await_proof(job_id, timeout_s=10)).state == "done"
            assert d.jobs.queued() == scanned(d.jobs) == (0, 0)
            assert "cuzk_queued_input_bytes 0.0" in await d.metrics_text()

    run_daemon(tmp_path, body, circuits=circom(tmp_path), max_frame_bytes="256KiB", max_queued_input=100_000)


def test_one_client_at_its_cap_leaves_room_for_the_others(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr, token=TENANT_A) as a, \
                await AsyncClient.connect(addr, token=TENANT_B) as b:
            mine = [await a.submit("syn", synthetic_partitions(1)) for _ in range(2)]
            with pytest.raises(Unavailable) as refused:
                await a.submit("syn", synthetic_partitions(1))
            assert str(refused.value) == (
                "this client has 2 unfinished jobs (queued or running), its cap ([daemon] max_jobs_per_owner = 2); "
                "send it again once some jobs have finished")
            other = await b.submit("syn", synthetic_partitions(1))  # the other client is still served
            assert not other.duplicate
            assert (await a.status())["queue"]["jobs"] == 2 and (await b.status())["queue"]["jobs"] == 1
            owner_a = d.jobs.jobs[mine[0].job_id].owner
            assert d.jobs.queued(owner_a) == scanned(d.jobs, owner_a) == (2, 0)
            d.engine.gate.set()
            await a.await_proof(mine[0].job_id, timeout_s=10)
            assert not (await a.submit("syn", synthetic_partitions(1))).duplicate

    run_daemon(tmp_path, body, tokens=[TENANT_A, TENANT_B], max_jobs_per_owner=2)


class HeldEngine(FakeEngine):
    """The engine double with its gate closed from the start: restored jobs wait."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gate.clear()


def test_jobs_restored_from_the_journal_count_and_are_never_refused(tmp_path: Path) -> None:
    size = 40_000
    circuits = circom(tmp_path)
    ids: list[str] = []

    async def first(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            ids.extend([(await c.submit("circ", witness(size), request_id=f"r{i}")).job_id for i in range(3)])

    run_daemon(tmp_path, first, circuits=circuits, max_frame_bytes="256KiB")  # the stop leaves them queued

    async def second() -> None:  # the caps were lowered since: the three jobs are more than they allow
        cfg = make_config(tmp_path, circuits, max_frame_bytes="256KiB", max_queued_input="64KiB", max_queued_jobs=2)
        d = Daemon(cfg, engine_factory=HeldEngine)
        await d.start()
        try:
            assert d.jobs is not None and d.engine.submitted == ids  # every one resumed
            assert d.jobs.queued() == scanned(d.jobs) == (3, 3 * size)
            async with await AsyncClient.connect(str(cfg.listen)) as c:
                with pytest.raises(Unavailable, match=re.escape("holds 3 unfinished jobs (queued or running), its "
                                                                "cap ([daemon] max_queued_jobs = 2)")):
                    await c.submit("circ", witness(1000))
                again = await c.submit("circ", witness(size), request_id="r0")  # a repeat is answered at the cap
                assert again.duplicate and again.job_id == "r0"
                d.engine.gate.set()
                for job_id in ids:
                    assert (await c.await_proof(job_id, timeout_s=10)).state == "done"
                assert d.jobs.queued() == (0, 0)
                assert (await c.prove("circ", witness(size), timeout_s=10)).state == "done"
        finally:
            await d.stop()

    asyncio.run(second())


def test_a_restored_job_that_cannot_run_gives_its_place_back(tmp_path: Path) -> None:
    ids: list[str] = []

    async def first(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            ids.extend([(await c.submit("extra", synthetic_partitions(1))).job_id for _ in range(2)])

    run_daemon(tmp_path, first, circuits={"extra": {"synthetic": "porep-like", "log_n": 10}})

    async def second(d: Daemon, addr: str) -> None:  # "extra" is gone: both fail at start, holding nothing
        await asyncio.to_thread(wait_until, lambda: all(d.jobs.jobs[j].done.is_set() for j in ids), 10)
        assert d.jobs.queued() == scanned(d.jobs) == (0, 0)
        async with await AsyncClient.connect(addr) as c:
            assert not (await c.submit("syn", synthetic_partitions(1))).duplicate

    run_daemon(tmp_path, second, max_queued_jobs=1)
