"""A settle whose commit went unanswered: the worker's next try finds its own write and counts it once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import STALLING, connect, make_inputs, worker

from cuzk_mp.daemon.fleet.models import Claimed, Failed, JobOutput
from cuzk_mp.errors import ProofError, ResourceError


def _lose_the_answer(fleet: Any, monkeypatch: pytest.MonkeyPatch,
                     after: Callable[[], Awaitable[None]] | None = None) -> list[int]:
    """The first settle of ``fleet`` (a result or a failure: the transactions that send a notification)
    commits, then its call fails as a dropped connection would (after ``after`` ran); how many were lost."""
    from cuzk_mp.daemon.fleet import settles

    real_tx, real_notify = fleet._tx, settles.notify
    armed, lost = [False], [0]

    async def notify(conn: Any, event: dict[str, str]) -> None:
        armed[0] = lost[0] == 0
        await real_notify(conn, event)

    @contextlib.asynccontextmanager
    async def tx() -> AsyncIterator[Any]:
        async with real_tx() as pair:
            yield pair
        if armed[0]:
            armed[0], lost[0] = False, lost[0] + 1
            if after is not None:
                await after()
            raise ResourceError("fleet: database: OperationalError: the connection was lost")

    monkeypatch.setattr(settles, "notify", notify)
    fleet._tx = tx
    return lost


async def _run_one(fleet: Any, run_job: Callable[[Claimed], Awaitable[JobOutput]],
                   capacity: Callable[[], int] = lambda: 1) -> Any:
    """A worker of ``fleet`` runs one job with ``run_job`` and settles it; the worker, stopped."""
    started = asyncio.Event()

    async def run(c: Claimed) -> JobOutput:
        started.set()
        return await run_job(c)

    w = worker(fleet, run, resident=lambda: ["x"], capacity=capacity)
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop))
    try:
        await asyncio.wait_for(started.wait(), 20)
        deadline = asyncio.get_running_loop().time() + 20
        while w.running:
            assert asyncio.get_running_loop().time() < deadline, "the job was never settled"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    return w


def test_a_result_whose_commit_went_unanswered_is_counted_once(fleet_dsn: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        lost = _lose_the_answer(a, monkeypatch)

        async def run_job(c: Claimed) -> JobOutput:
            return JobOutput(b"proof")

        w = await _run_one(a, run_job)
        assert lost == [1]
        st = await a.status(ref.job_id)
        assert (st.state, st.result, st.box) == ("done", b"proof", "a")
        assert (w.completed, w.failed) == (1, 0)
        await a.close()

    asyncio.run(main())


def test_a_failure_whose_commit_went_unanswered_is_counted_once(fleet_dsn: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure is recorded and the job goes back to the queue, where another box claims it before
    the failing box's next try: that try still knows the failure for its own."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        taken: list[Claimed] = []

        async def b_claims() -> None:
            taken.extend(await b.claim(["x"], 1))

        lost = _lose_the_answer(a, monkeypatch, after=b_claims)

        async def run_job(c: Claimed) -> JobOutput:
            raise ProofError("verification of the fresh proof failed")

        w = await _run_one(a, run_job)
        assert lost == [1] and [c.job_id for c in taken] == [ref.job_id]
        st = await a.status(ref.job_id)
        assert (st.state, st.box, st.attempts, st.failed_on) == ("running", "b", 1, ("a",))
        assert (w.completed, w.failed, dict(w.failures)) == (0, 1, {("x", "ProofError"): 1})
        for f in (a, b):
            await f.close()

    asyncio.run(main())



def test_a_failure_another_box_settled_after_the_claim_lapsed_is_not_counted(fleet_dsn: str, tmp_path: Path) -> None:
    """A box's claim lapses while its run goes on; another box claims the job again and records its own
    failure (the job is queued again). The first box's run then fails: ``fail`` finds the job queued,
    but not by this box, so the box's failures metric must not count it."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", heartbeats=False, **STALLING)  # never renews: its claim lapses
        b = await connect(fleet_dsn, "b", **STALLING)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        go_on = asyncio.Event()

        async def run_job(c: Claimed) -> JobOutput:
            await go_on.wait()
            raise ProofError("verification of the fresh proof failed")

        async def take_over() -> None:
            await asyncio.sleep(STALLING["stall_timeout_s"] + 0.3)
            [c] = await b.claim(["x"], 1)
            assert c.job_id == ref.job_id and c.claims == 2
            assert await b.fail(ref.job_id, "GPU fault", error_kind="WorkerDied") == Failed("queued", recorded=True)
            go_on.set()

        taking = asyncio.create_task(take_over())
        w = await _run_one(a, run_job, capacity=lambda: 0 if go_on.is_set() else 1)  # one run only
        await taking
        st = await a.status(ref.job_id)
        # attempts: the lapse of a's claim, then b's failure
        assert (st.state, st.attempts, st.error, st.failed_on) == ("queued", 2, "GPU fault", ("a", "b"))
        assert w.failed == 1 and dict(w.failures) == {}  # the run failed here; its failure was recorded by b
        for f in (a, b):
            await f.close()

    asyncio.run(main())
