"""The shared queue with boxes as real processes: a cancel crosses processes, a SIGKILLed box's job is
taken over after the stall timeout and completes once, and three boxes prove every job exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleet_helpers import STALLING, BoxProcess, connect, make_inputs, query_one


def run(coro):  # type: ignore[no-untyped-def]
    """Run one test's coroutine on a fresh event loop."""
    return asyncio.run(coro)


def test_cancel_from_box_a_stops_the_job_running_on_box_b(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)
    # b renews every 5 s: an abort within ~1 s can only have come through the cancellation NOTIFY.
    b = BoxProcess(fleet_dsn, "b", ["x"], work_s=120, heartbeat_s=5.0, stall_s=20.0)
    try:
        b.wait_for("ready")

        async def main() -> None:
            a = await connect(fleet_dsn, "a")
            ref = await a.submit(None, "x", inp.ref, inp.sha256)
            await asyncio.to_thread(b.wait_for, "started", job_id=ref.job_id)
            t0 = time.time()
            assert await a.cancel(ref.job_id)
            aborted = await asyncio.to_thread(b.wait_for, "aborted", 10.0, job_id=ref.job_id)
            assert aborted["reason"] == "cancelled" and aborted["t"] - t0 < 2.0
            st = await a.await_result(ref.job_id, 5)
            assert (st.state, st.box, st.result) == ("cancelled", "b", None)
            await a.close()

        run(main())
        assert b.stop() == 0
        assert b.named("stopped")[0]["aborted"] == 1 and b.named("stopped")[0]["completed"] == 0
    finally:
        b.stop()


def test_sigkill_of_a_box_mid_job_its_job_completes_elsewhere_once(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)
    stall_s = STALLING["stall_timeout_s"]
    k = BoxProcess(fleet_dsn, "k", ["x"], work_s=120, stall_s=stall_s)
    try:
        k.wait_for("ready")

        async def main() -> None:
            s = await connect(fleet_dsn, "s", **STALLING)
            ref = await s.submit("req-kill", "x", inp.ref, inp.sha256)
            await asyncio.to_thread(k.wait_for, "started", job_id=ref.job_id)
            await asyncio.sleep(0.6)  # at least one renewal of k's claim
            k.kill()
            t_kill = time.monotonic()
            assert await s.claim(["x"], 1) == []  # k's last renewal is younger than the stall timeout
            while not (claimed := await s.claim(["x"], 1)):
                await asyncio.sleep(0.1)
            waited = time.monotonic() - t_kill
            [c] = claimed
            assert c.job_id == ref.job_id and c.claims == 2
            assert stall_s - STALLING["heartbeat_interval_s"] - 0.1 <= waited < stall_s + 3.0
            assert await s.complete(c.job_id, b"from s")
            st = await s.await_result(ref.job_id, 5)
            assert (st.state, st.box, st.result, st.claims) == ("done", "s", b"from s", 2)
            assert not await s.complete(c.job_id, b"twice")
            boxes = {b.box: b.state for b in await s.boxes()}
            assert boxes["k"] == "stale"
            await s.close()

        run(main())
    finally:
        k.stop()
    assert query_one(fleet_dsn, "SELECT count(*), sum(claims) FROM cuzk_fleet_jobs") == (1, 2)


def test_three_box_processes_prove_every_job_exactly_once(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 45)
    resident = {"p": ["x", "y"], "q": ["x"], "r": ["y"]}
    boxes = [BoxProcess(fleet_dsn, name, circuits, slots=2, work_s=0.02) for name, circuits in resident.items()]
    try:
        for b in boxes:
            b.wait_for("ready")

        async def main() -> dict[str, str]:
            client = await connect(fleet_dsn, "client")
            jobs = {}
            for i, inp in enumerate(inputs):
                ref = await client.submit(f"req-{i}", "xy"[i % 2], inp.ref, inp.sha256)
                jobs[ref.job_id] = inp.sha256
            results = await asyncio.gather(*[client.await_result(j, 60) for j in jobs])
            for st in results:
                assert st.state == "done" and st.claims == 1, (st, [b.stderr() for b in boxes])
                out = json.loads(st.result or b"")
                assert out["digest"] == jobs[st.job_id] and out["box"] == st.box
                assert st.circuit_id in resident[st.box or ""]
            await client.close()
            return {st.job_id: st.box or "" for st in results}

        ran_on = run(main())
    finally:
        for b in boxes:
            b.stop()
    started = [(ev["job_id"], b.box) for b in boxes for ev in b.named("started")]
    assert len(started) == len({j for j, _ in started}) == len(inputs)
    assert dict(started) == ran_on
    assert len(set(ran_on.values())) == 3, "every box should have taken part"


@contextlib.contextmanager
def _frozen_box(dsn: str, hold: str, stopped_at: str) -> Iterator[dict[str, Any]]:
    """A box process (stall timeout 1 s) that stops where ``hold`` makes it (box_process.py), frozen
    there by SIGSTOP once it says so (its ``stopped_at`` event, yielded); killed after the block."""
    frozen = BoxProcess(dsn, "frozen", ["x"], heartbeat_s=0.25, stall_s=1.0, hold=hold)
    try:
        event = frozen.wait_for(stopped_at)
        frozen.freeze()
        yield event
    finally:
        frozen.kill()


def test_a_box_frozen_inside_a_transaction_frees_its_job_for_another_box(fleet_dsn: str, tmp_path: Path) -> None:
    """A box frozen (SIGSTOP) between two statements of a transaction that holds a claimed job's rows:
    its kernel still answers for its connections, so only the server's idle-in-transaction timeout (the
    box's stall timeout) ends that transaction. Without it the server kept the rows locked for as long as
    the box stayed frozen, and no box could take the job over (nor settle or cancel it)."""
    [inp] = make_inputs(tmp_path, 1)
    knobs = {**STALLING, "heartbeat_interval_s": 0.25, "stall_timeout_s": 1.0}

    async def submit() -> str:
        s = await connect(fleet_dsn, "s", **knobs)
        ref = await s.submit(None, "x", inp.ref, inp.sha256)
        await s.close()
        return ref.job_id

    async def take_over() -> float:
        s = await connect(fleet_dsn, "s", **knobs)
        t0 = time.monotonic()
        while not (claimed := await s.claim(["x"], 1)) and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.1)
        taken_after = time.monotonic() - t0
        assert [c.job_id for c in claimed] == [job_id]
        assert await s.complete(job_id, b"from s")
        await s.close()
        return taken_after

    job_id = run(submit())
    with _frozen_box(fleet_dsn, "claim", "holding") as held:
        assert held["job_id"] == job_id
        taken_after = run(take_over())
    assert taken_after < 5.0, f"the job was taken over {taken_after:.1f} s after its box froze"


def test_a_box_frozen_while_it_joins_keeps_no_other_box_from_joining(fleet_dsn: str) -> None:
    """Every join takes the schema's migration lock, a session-level lock: a box frozen (SIGSTOP) while
    it held it, between two statements and outside any transaction, kept every other box (and `fleet
    status`) from joining for as long as it stayed frozen. Its session ends once idle for its stall
    timeout, and the lock with it."""

    async def join() -> float:
        t0 = time.monotonic()
        b = await asyncio.wait_for(connect(fleet_dsn, "b"), 20)
        joined_after = time.monotonic() - t0
        await b.close()
        return joined_after

    with _frozen_box(fleet_dsn, "migration", "migrating"):
        joined_after = run(join())
    assert joined_after < 5.0, f"a box joined {joined_after:.1f} s after the one migrating froze"


def test_a_box_frozen_with_its_notifications_unread_holds_back_no_other_box(fleet_dsn: str, tmp_path: Path) -> None:
    """A box frozen (SIGSTOP) reads nothing of its LISTEN connection: the server's backend for it sends
    the fleet's notifications until the box's socket buffers are full, then waits on the send, and the
    database's notification queue keeps everything from where that backend stopped reading. Other boxes
    go on and their waiters hear of each job at once (not at the 60 s safety-net read), and the server
    gives up on the frozen box's connection once its sends go unacknowledged for the box's connect
    timeout (its session's tcp_user_timeout): with the operating system's defaults its kernel
    acknowledged the zero-window probes for as long as it stayed frozen, and the backend and the queue
    it holds back stayed (a full queue fails every NOTIFY, so every submit and every settle)."""
    import psycopg

    from cuzk_mp.daemon.fleet.schema import EVENTS_CHANNEL

    inputs = make_inputs(tmp_path, 30)
    frozen = BoxProcess(fleet_dsn, "frozen", ["z"], connect_timeout_s=2.0)  # it runs none of these jobs
    working = BoxProcess(fleet_dsn, "w", ["x"], slots=4)
    listening = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cuzk-fleet frozen' "
                 "AND query LIKE 'LISTEN%'")
    try:
        for b in (frozen, working):
            b.wait_for("ready")
        assert query_one(fleet_dsn, listening) == (1,)
        frozen.freeze()
        noise = json.dumps({"event": "noise", "pad": "n" * 7000})
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:  # several MB: more than any socket buffers
            for _ in range(1000):
                conn.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, noise))
        flooded = time.monotonic()

        async def main() -> float:
            client = await connect(fleet_dsn, "client")
            t0 = time.monotonic()
            refs = [await client.submit(None, "x", inp.ref, inp.sha256) for inp in inputs]
            done = await asyncio.wait_for(asyncio.gather(*[client.await_result(r.job_id, 60) for r in refs]), 20)
            assert all(st.state == "done" for st in done), done
            await client.close()
            return time.monotonic() - t0

        took = run(main())
        while query_one(fleet_dsn, listening) != (0,) and time.monotonic() - flooded < 30:
            time.sleep(0.2)
        dropped_after = time.monotonic() - flooded
    finally:
        frozen.kill()
        working.stop()
    assert took < 15, f"the other boxes' {len(inputs)} jobs took {took:.1f} s"
    assert dropped_after < 15, f"the frozen box's LISTEN connection was still open {dropped_after:.1f} s on"
