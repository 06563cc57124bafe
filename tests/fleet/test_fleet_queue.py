"""The shared queue against a real PostgreSQL: several boxes as several Fleet objects in one process.

Each Fleet has its own connections, so claims race in the database exactly as between machines.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import STALLING, connect, make_inputs, query_one, worker

from cuzk_mp.daemon.fleet.keys import holders_by_circuit
from cuzk_mp.daemon.fleet.models import Failed, JobOutput
from cuzk_mp.errors import InputError, ProofError
from cuzk_mp.pipeline.types import Priority


def run(coro):  # type: ignore[no-untyped-def]
    """Run one test's coroutine on a fresh event loop."""
    return asyncio.run(coro)


def test_one_request_id_sent_to_two_boxes_is_one_job(fleet_dsn: str, tmp_path: Path) -> None:
    [inp], [other] = make_inputs(tmp_path, 1), make_inputs(tmp_path, 1, "other")

    async def main() -> None:
        a, b, c = [await connect(fleet_dsn, n) for n in "abc"]
        refs = await asyncio.gather(*[box.submit("req-1", "x", inp.ref, inp.sha256)
                                      for box in (a, b) * 8])
        assert len({r.job_id for r in refs}) == 1
        assert sum(not r.duplicate for r in refs) == 1
        [claimed] = await b.claim(["x"], 4)
        assert await b.complete(claimed.job_id, b"proof")
        again = await c.submit("req-1", "x", inp.ref, inp.sha256)  # after it finished, from a third box
        assert (again.job_id, again.state, again.duplicate) == (claimed.job_id, "done", True)
        with pytest.raises(InputError, match="already names job"):
            await a.submit("req-1", "x", other.ref, other.sha256)
        assert await c.claim(["x"], 4) == []
        for box in (a, b, c):
            await box.close()

    run(main())
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_jobs") == (1,)
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_pgqueuer") == (0,)


def test_priorities_on_a_one_slot_box(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 6)
    order = [Priority.LOW, Priority.NORMAL, Priority.CRITICAL, Priority.NORMAL, Priority.HIGH, Priority.CRITICAL]

    async def main() -> list[str]:
        a = await connect(fleet_dsn, "a")
        ids = [(await a.submit(None, "x", i.ref, i.sha256, p)).job_id for i, p in zip(inputs, order, strict=True)]
        ran = []
        while claimed := await a.claim(["x"], 1):
            assert len(claimed) == 1
            ran.append(claimed[0].job_id)
            assert await a.complete(claimed[0].job_id, b"ok")
        await a.close()
        return [str(order[ids.index(j)].name) + f"#{ids.index(j)}" for j in ran]

    assert run(main()) == ["CRITICAL#2", "CRITICAL#5", "HIGH#4", "NORMAL#1", "NORMAL#3", "LOW#0"]


def test_affinity_boxes_claim_only_resident_circuits(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 31)
    resident = {"a": ["x"], "b": ["y"], "c": ["x", "y"]}

    async def main() -> None:
        boxes = {n: await connect(fleet_dsn, n) for n in resident}
        jobs = {}
        for i, inp in enumerate(inputs[:30]):
            ref = await boxes["abc"[i % 3]].submit(None, "xy"[i % 2], inp.ref, inp.sha256)
            jobs[ref.job_id] = "xy"[i % 2]
        orphan = await boxes["a"].submit(None, "z", inputs[30].ref, inputs[30].sha256)
        ran: dict[str, str] = {}

        def runner(name: str):  # type: ignore[no-untyped-def]
            async def run_job(c):  # type: ignore[no-untyped-def]
                assert c.circuit_id in resident[name]
                assert c.job_id not in ran
                ran[c.job_id] = name
                await asyncio.sleep(0.01)
                return JobOutput(name.encode())
            return run_job

        stop = asyncio.Event()
        workers = [worker(boxes[n], runner(n), resident=lambda n=n: resident[n], capacity=lambda: 2)
                   for n in resident]
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        for job_id in jobs:
            assert (await boxes["a"].await_result(job_id, 30)).state == "done"
        stop.set()
        await asyncio.gather(*tasks)
        assert set(ran) == set(jobs)
        for job_id, circuit in jobs.items():
            st = await boxes["a"].status(job_id)
            assert circuit in resident[st.box or ""] and st.result == st.box.encode() and st.claims == 1
        assert {ran[j] for j, c in jobs.items() if c == "x"} <= {"a", "c"}
        assert {ran[j] for j, c in jobs.items() if c == "y"} <= {"b", "c"}
        assert (await boxes["a"].status(orphan.job_id)).state == "queued"  # no box holds z's key
        depths = {(d.circuit_id, d.queued) for d in await boxes["a"].queue_depths()}
        assert depths == {("z", 1)}
        for f in boxes.values():
            await f.close()

    run(main())


def test_every_job_claimed_once_under_concurrent_claimers(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 120)

    async def main() -> None:
        boxes = [await connect(fleet_dsn, f"b{i}") for i in range(4)]
        for i, inp in enumerate(inputs):
            await boxes[i % 4].submit(None, "x", inp.ref, inp.sha256)
        got: list[list[str]] = [[] for _ in boxes]

        async def drain(i: int) -> None:
            while claimed := await boxes[i].claim(["x"], 3):
                got[i].extend(c.job_id for c in claimed)
                for c in claimed:
                    assert await boxes[i].complete(c.job_id, f"b{i}".encode())

        await asyncio.gather(*[drain(i) for i in range(4)])
        every = [j for g in got for j in g]
        assert len(every) == len(set(every)) == len(inputs)
        assert sum(1 for g in got if g) >= 2, "the claimers did not actually race"
        for f in boxes:
            await f.close()

    run(main())


def test_results_are_written_once(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        await a.claim(["x"], 1)
        wins = await asyncio.gather(*[box.complete(ref.job_id, box.box.encode() * 3) for box in (a, b) * 4])
        assert sum(wins) == 1
        st = await b.status(ref.job_id)
        assert st.state == "done" and st.result == st.box.encode() * 3  # type: ignore[union-attr]
        assert await a.fail(ref.job_id, "too late") == Failed("done", recorded=False)
        assert not await b.cancel(ref.job_id)
        assert (await a.status(ref.job_id)).result == st.result
        with pytest.raises(InputError, match="must stay small"):
            await a.complete(ref.job_id, b"\0" * (5 << 20))
        for f in (a, b):
            await f.close()

    run(main())


def test_failed_attempts_retry_then_fail(fleet_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    [inp, bad] = make_inputs(tmp_path, 2)
    caplog.set_level("INFO", logger="cuzk_mp.daemon.fleet")

    async def main() -> None:
        a = await connect(fleet_dsn, "a", max_attempts=2)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        [c1] = await a.claim(["x"], 1)
        assert await a.fail(ref.job_id, "prover died", error_kind="WorkerDied") == Failed("queued", recorded=True)
        await asyncio.sleep(0.05)
        [c2] = await a.claim(["x"], 1)
        assert (c1.claims, c2.claims, c2.attempts) == (1, 2, 1)
        assert "after a failed attempt" in caplog.text and "stopped renewing" not in caplog.text
        assert await a.fail(ref.job_id, "prover died again", error_kind="WorkerDied") == Failed("failed", recorded=True)
        st = await a.await_result(ref.job_id, 5)
        assert (st.state, st.attempts, st.error, st.error_kind) == ("failed", 2, "prover died again", "WorkerDied")
        ref2 = await a.submit(None, "x", bad.ref, bad.sha256)
        await a.claim(["x"], 1)
        assert await a.fail(ref2.job_id, "witness does not satisfy", error_kind="InputError",
                            retry=False) == Failed("failed", recorded=True)
        await a.close()

    run(main())


def test_await_result_wakes_on_notify(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        # Heartbeats and polls every 30 s: only NOTIFY can wake the waiter in time.
        a = await connect(fleet_dsn, "a", heartbeat_interval_s=30, stall_timeout_s=90)
        b = await connect(fleet_dsn, "b", heartbeat_interval_s=30, stall_timeout_s=90)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        t0 = time.monotonic()
        st = await a.await_result(ref.job_id, 0.3)
        assert st.state == "queued" and 0.3 <= time.monotonic() - t0 < 5
        waiter = asyncio.create_task(a.await_result(ref.job_id, 60))
        await b.claim(["x"], 1)
        await asyncio.sleep(0.2)
        assert not waiter.done()
        t0 = time.monotonic()
        await b.complete(ref.job_id, b"r")
        st = await waiter
        assert st.state == "done" and st.result == b"r" and time.monotonic() - t0 < 2.0
        for f in (a, b):
            await f.close()

    run(main())


def test_stalled_box_loses_its_claim_and_cannot_requeue_it(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        b = await connect(fleet_dsn, "b", heartbeats=False, **STALLING)  # never renews: a box that hangs
        c = await connect(fleet_dsn, "c", **STALLING)
        ref = await c.submit(None, "x", inp.ref, inp.sha256)
        [held_b] = await b.claim(["x"], 1)
        assert await c.claim(["x"], 1) == []  # within the stall timeout the claim stands
        await asyncio.sleep(STALLING["stall_timeout_s"] + 0.3)
        [held_c] = await c.claim(["x"], 1)
        assert held_c.claims == 2
        assert await b.heartbeat() == [ref.job_id] and held_b.aborted.is_set()
        assert "claimed again by box c" in held_b.abort_reason
        assert await b.fail(ref.job_id, "late failure") == Failed("running", recorded=False)  # not b's any more
        assert (await c.status(ref.job_id)).box == "c"
        assert await c.complete(ref.job_id, b"c")
        assert await c.heartbeat() == []
        for f in (b, c):
            await f.close()

    run(main())


def test_a_clean_close_releases_claims_at_once(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b", stall_timeout_s=60)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        await b.claim(["x"], 1)
        await b.close()
        [again] = await a.claim(["x"], 1)  # no stall timeout to wait for
        assert again.job_id == ref.job_id and again.attempts == 0
        assert {x.box: x.state for x in await a.boxes()} == {"a": "up", "b": "left"}
        await a.close()

    run(main())


def test_cancel_of_a_queued_job_and_unknown_jobs(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        assert await a.cancel(ref.job_id)
        assert await a.claim(["x"], 1) == []
        assert (await a.status(ref.job_id)).state == "cancelled"
        for call in (a.status("nope"), a.cancel("nope")):
            with pytest.raises(InputError, match="unknown job"):
                await call
        with pytest.raises(InputError, match="inputs_sha256"):
            await a.submit(None, "x", inp.ref, "abc")
        with pytest.raises(InputError, match="inputs_ref"):
            await a.submit(None, "x", "relative/path", inp.sha256)
        with pytest.raises(InputError, match="n_partitions"):
            await a.submit(None, "x", inp.ref, inp.sha256, n_partitions=0)
        await a.close()

    run(main())


def test_worker_settles_errors_by_kind(fleet_dsn: str, tmp_path: Path) -> None:
    [good, bad, flaky] = make_inputs(tmp_path, 3)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", max_attempts=3)
        ids = {name: (await a.submit(None, "x", i.ref, i.sha256)).job_id
               for name, i in (("good", good), ("bad", bad), ("flaky", flaky))}
        tries: dict[str, int] = {}

        async def run_job(c):  # type: ignore[no-untyped-def]
            tries[c.job_id] = tries.get(c.job_id, 0) + 1
            if c.job_id == ids["bad"]:
                raise InputError("witness: constraint 7 not satisfied")
            if c.job_id == ids["flaky"] and tries[c.job_id] < 3:
                raise ProofError("verification of the fresh proof failed")
            return JobOutput(b"proof")

        stop = asyncio.Event()
        task = asyncio.create_task(worker(a, run_job, resident=lambda: ["x"], capacity=lambda: 1).run(stop))
        states = {n: await a.await_result(j, 20) for n, j in ids.items()}
        stop.set()
        await task
        assert states["good"].state == "done" and tries[ids["good"]] == 1
        assert (states["bad"].state, states["bad"].error_kind, tries[ids["bad"]]) == ("failed", "InputError", 1)
        assert (states["flaky"].state, states["flaky"].attempts, tries[ids["flaky"]]) == ("done", 2, 3)
        await a.close()

    run(main())


def test_a_worker_claims_the_jobs_of_a_key_its_idle_hook_loaded_at_once(fleet_dsn: str, tmp_path: Path) -> None:
    """A key loaded for the backlog (the idle hook) has its waiting jobs claimed right after the load,
    not after the poll interval: no NOTIFY comes for jobs that were already queued."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        resident, wanted = ["x"], []

        async def on_idle() -> None:
            if wanted and wanted[0] not in resident:
                resident.append(wanted[0])  # as the daemon's key loading does, after engine.preload

        async def run_job(c):  # type: ignore[no-untyped-def]
            return JobOutput(b"proof")

        stop = asyncio.Event()
        task = asyncio.create_task(worker(a, run_job, resident=lambda: resident, capacity=lambda: 1, poll_s=30.0,
                                          on_idle=on_idle).run(stop))
        await asyncio.sleep(1.0)  # asleep: nothing to claim, no key to load
        wanted.append("z")
        job = (await a.submit(None, "z", inp.ref, inp.sha256)).job_id  # its NOTIFY wakes the worker: z loads
        state = (await a.await_result(job, 10)).state
        stop.set()
        await task
        assert state == "done"
        await a.close()

    run(main())


def test_a_retry_goes_to_a_box_the_job_has_not_failed_on(fleet_dsn: str, tmp_path: Path) -> None:
    """Box a fails every job at once (a GPU broken but not reported dead), box b proves them; both hold
    the key. a, its slots always free first, claimed its own retries again: jobs spent every attempt
    there and ended failed although b was there to run them. Each retry now goes to b."""
    inputs = make_inputs(tmp_path, 8)
    knobs = {"max_attempts": 3, "heartbeat_interval_s": 2.0}

    async def broken(c):  # type: ignore[no-untyped-def]
        raise ProofError("the GPU returned a proof that does not verify")

    async def proving(c):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)
        return JobOutput(b"proof")

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a", **knobs), await connect(fleet_dsn, "b", **knobs)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(worker(f, run_job, resident=lambda: ["x"], capacity=lambda: 2).run(stop))
                 for f, run_job in ((a, broken), (b, proving))]
        while not all(box.resident == ("x",) for box in await a.boxes()):  # both heartbeats name the key
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        ids = [(await a.submit(None, "x", i.ref, i.sha256)).job_id for i in inputs]
        ended = [await a.await_result(j, 20) for j in ids]
        elapsed = time.monotonic() - t0
        stop.set()
        await asyncio.gather(*tasks)
        assert [(st.state, st.box) for st in ended] == [("done", "b")] * len(ids), [
            (st.state, st.box, st.attempts, st.error) for st in ended]
        assert all(st.failed_on == (("a",) if st.attempts else ()) for st in ended)
        assert elapsed < 5, elapsed
        for f in (a, b):
            await f.close()

    run(main())


def test_a_job_no_other_box_can_take_retries_at_once_on_the_box_it_failed_on(fleet_dsn: str, tmp_path: Path) -> None:
    """Box a is the only one holding the job's key (b holds another): a transient fault fails the first
    attempt, and the job runs again on a after retry_delay, not kept from it for a box that does not
    exist; its record names the box it failed on."""
    [inp] = make_inputs(tmp_path, 1)
    knobs = {"retry_delay_s": 0.2, "heartbeat_interval_s": 3.0}
    tries: list[float] = []

    async def flaky(c):  # type: ignore[no-untyped-def]
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise ProofError("CUDA error: an illegal memory access was encountered")
        return JobOutput(b"proof")

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a", **knobs), await connect(fleet_dsn, "b", **knobs)
        await b.claim(["y"], 1)
        await b.heartbeat()
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        stop = asyncio.Event()
        task = asyncio.create_task(worker(a, flaky, resident=lambda: ["x"], capacity=lambda: 1, poll_s=0.1).run(stop))
        st = await a.await_result(ref.job_id, 20)
        stop.set()
        await task
        assert (st.state, st.box, st.attempts, st.failed_on) == ("done", "a", 1, ("a",))
        assert tries[1] - tries[0] < knobs["heartbeat_interval_s"], tries
        for f in (a, b):
            await f.close()

    run(main())


def test_a_retry_another_box_did_not_pick_still_waits_for_the_box_it_failed_on(fleet_dsn: str, tmp_path: Path) -> None:
    """b, one slot free, claims a more urgent job than a retry that failed on a: the retry, made
    claimable for b's claim, has its wait back after it, and a does not take it before that wait is
    over; b may still take it at once."""
    [inp, urgent] = make_inputs(tmp_path, 2)
    knobs = {"heartbeats": False, "heartbeat_interval_s": 2.0}

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a", **knobs), await connect(fleet_dsn, "b", **knobs)
        await b.claim(["x"], 0)
        await b.heartbeat()  # b's row names the key
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        await a.claim(["x"], 1)
        assert await a.fail(ref.job_id, "GPU fault", error_kind="ProofError") == Failed("queued", recorded=True)
        hot = await a.submit(None, "x", urgent.ref, urgent.sha256, Priority.CRITICAL)
        assert [c.job_id for c in await b.claim(["x"], 1)] == [hot.job_id]
        assert await a.claim(["x"], 1) == []
        assert [c.job_id for c in await b.claim(["x"], 1)] == [ref.job_id]
        for f in (a, b):
            await f.close()

    run(main())


def test_boxes_migrate_concurrently_on_a_fresh_database(fleet_dsn: str) -> None:
    async def main() -> None:
        boxes = await asyncio.gather(*[connect(fleet_dsn, f"b{i}") for i in range(4)])
        assert sorted(b.box for b in await boxes[0].boxes()) == ["b0", "b1", "b2", "b3"]
        for f in boxes:
            await f.close()

    run(main())


def test_joining_or_looking_while_a_transaction_holds_a_job_stalls_no_box(fleet_dsn: str, tmp_path: Path) -> None:
    """A box hung inside a transaction (stopped, or cut off while the server keeps its session) holds
    a job's row until the server notices. A box that joins meanwhile, or `fleet status` (an observer),
    must not queue an exclusive lock on the jobs table behind it: every other box's statements on
    the table would queue behind that lock, and the one hung box would stall the whole fleet. On a
    database whose schema is current, joining changes no table."""
    import psycopg

    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        async with await psycopg.AsyncConnection.connect(fleet_dsn) as hung:
            await hung.execute("UPDATE cuzk_fleet_jobs SET priority = priority WHERE job_id = %s", (ref.job_id,))
            observer = await asyncio.wait_for(connect(fleet_dsn, "status", register=False), 10)
            b = await asyncio.wait_for(connect(fleet_dsn, "b"), 10)
            assert (await asyncio.wait_for(a.status(ref.job_id), 5)).state == "queued"
            await hung.rollback()
        for f in (observer, b, a):
            await f.close()

    run(main())


def test_the_server_gives_up_on_a_silent_box_as_soon_as_the_box_gives_up_on_it(fleet_dsn: str) -> None:
    """Every session a box opens tells the server to probe an idle peer after the connect timeout, to end
    the connection once the peer is silent that long, and to end a transaction left idle for the stall
    timeout: without them the server kept a dead box's session, and the locks of the transaction it
    was in, for 2 hours and 11 minutes (the operating system's keepalive defaults). An ordinary role
    may set them; options of the dsn are kept, and win where they set the same."""
    import psycopg

    from cuzk_mp.daemon.fleet.config import FleetConfig
    from cuzk_mp.daemon.fleet.store import first_connection

    names = ["tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout",
             "idle_in_transaction_session_timeout", "statement_timeout"]
    expected = {"tcp_keepalives_idle": "6", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                "tcp_user_timeout": "6000", "idle_in_transaction_session_timeout": "4000", "statement_timeout": "0"}
    knobs = {"connect_timeout_s": 6.0, "stall_timeout_s": 4.0, "heartbeat_interval_s": 0.5}
    role = f"plain_box_{os.getpid()}"
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]

    async def settings(conn: Any) -> dict[str, str]:
        cur = await conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s) UNION ALL "
                                 "SELECT 'is_superuser', current_setting('is_superuser')", (names,))
        return dict(await cur.fetchall())

    async def main() -> list[dict[str, str]]:
        a = await connect(fleet_dsn, "a", **knobs)
        async with a._tx() as (conn, _):
            pooled = await settings(conn)
        await a.close()
        seen = [pooled]
        for dsn in (fleet_dsn.replace("cuzk@", f"{role}@"),
                    fleet_dsn + "?options=-c%20tcp_keepalives_idle%3D30%20-c%20statement_timeout%3D5000"):
            async with await first_connection(FleetConfig(dsn=dsn, box="b", **knobs)) as conn:
                seen.append(await settings(conn))
        return seen

    try:
        pooled, plain, given = run(main())
    finally:
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]
    assert pooled == {**expected, "is_superuser": "on"}
    assert plain == {**expected, "is_superuser": "off"}
    assert given == {**expected, "tcp_keepalives_idle": "30", "statement_timeout": "5000", "is_superuser": "on"}


def test_a_box_upgrading_the_schema_behind_a_transaction_holding_a_job_gives_up_soon(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box of a newer release joins (the schema must change) while a transaction holds a job's row
    (a box hung mid-claim, whose session the server keeps for as long as TCP does): its DDL waits for
    the table's exclusive lock, and every box's statements on the table wait behind it. The DDL waits
    :data:`~cuzk_mp.daemon.fleet.schema.DDL_LOCK_TIMEOUT_S` at most: that box's start fails (exit 4,
    systemd tries again) and the fleet goes on, rather than both waiting for the hung session."""
    import psycopg

    from cuzk_mp.daemon.fleet import schema
    from cuzk_mp.errors import ResourceError

    monkeypatch.setattr(schema, "DDL_LOCK_TIMEOUT_S", 1.0)
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        async with await psycopg.AsyncConnection.connect(fleet_dsn, autocommit=True) as conn:
            await conn.execute("UPDATE cuzk_fleet_meta SET value = '5' WHERE key = 'schema_version'")
        async with await psycopg.AsyncConnection.connect(fleet_dsn) as hung:
            await hung.execute("UPDATE cuzk_fleet_jobs SET priority = priority WHERE job_id = %s", (ref.job_id,))
            t0 = time.monotonic()
            with pytest.raises(ResourceError, match="lock timeout"):
                await asyncio.wait_for(connect(fleet_dsn, "b"), 10)
            assert time.monotonic() - t0 < 5
            assert (await asyncio.wait_for(a.status(ref.job_id), 5)).state == "queued"
            await hung.rollback()
        b = await connect(fleet_dsn, "b")  # the session ended: the schema changes
        assert query_one(fleet_dsn, "SELECT value FROM cuzk_fleet_meta WHERE key = 'schema_version'") == (
            str(schema.SCHEMA_VERSION),)
        for f in (b, a):
            await f.close()

    run(main())


def test_a_box_that_renews_its_own_lapsed_claim_does_not_run_the_job_twice(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        # No heartbeats: as if the database had been unreachable for longer than the stall timeout.
        a = await connect(fleet_dsn, "a", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        [held] = await a.claim(["x"], 2)
        await asyncio.sleep(1.3)
        assert await a.claim(["x"], 2) == []  # re-picked, but it is already running here
        assert [c.job_id for c in a.held()] == [ref.job_id] and not held.aborted.is_set()
        assert await a.heartbeat() == []
        assert await a.complete(ref.job_id, b"once")
        assert (await a.status(ref.job_id)).claims == 2
        await a.close()

    run(main())


def test_prune_forgets_finished_jobs_and_their_request_ids(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        old = await a.submit("req-p", "x", inp.ref, inp.sha256)
        await a.claim(["x"], 1)
        await a.complete(old.job_id, b"r")
        running = await a.submit(None, "x", inp.ref, inp.sha256)
        assert await a.prune(3600) == 0
        assert await a.prune(0) == 1
        with pytest.raises(InputError, match="unknown job"):
            await a.status(old.job_id)
        assert (await a.status(running.job_id)).state == "queued"
        again = await a.submit("req-p", "x", inp.ref, inp.sha256)
        assert again.job_id != old.job_id and not again.duplicate
        await a.close()

    run(main())
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_pgqueuer_log WHERE aggregated") == (0,)
    assert query_one(fleet_dsn, "SELECT sum(count) FROM cuzk_pgqueuer_statistics")[0] >= 3


def test_a_heartbeat_racing_a_claim_keeps_the_new_claim(fleet_dsn: str, tmp_path: Path) -> None:
    """A job claimed while a heartbeat's read is in flight is not in that read; it is not "removed"."""
    inputs = make_inputs(tmp_path, 40)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", heartbeats=False)
        for inp in inputs:
            await a.submit(None, "x", inp.ref, inp.sha256)
        claimed = []
        for _ in range(len(inputs)):
            lost, got = await asyncio.gather(a.heartbeat(), a.claim(["x"], 1))
            assert lost == []
            claimed += got
        assert len(claimed) == len(inputs) and not any(c.aborted.is_set() for c in claimed)
        assert await a.heartbeat() == [] and len(a.held()) == len(inputs)
        await a.close()

    run(main())


def test_a_box_row_lists_a_key_from_the_first_claim_of_its_jobs(fleet_dsn: str, tmp_path: Path) -> None:
    """A key a box took on since its last heartbeat is in its row once it claims the key's jobs: fleet
    status never shows a box running a job of a key it does not list, and another box deciding whether
    to load that key counts this one as a holder (it loaded the same key for nothing before)."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a", heartbeats=False), await connect(fleet_dsn, "b", heartbeats=False)
        assert await a.claim(["x"], 2) == [] and await a.heartbeat() == []
        job = (await b.submit(None, "z", inp.ref, inp.sha256)).job_id
        assert [c.job_id for c in await a.claim(["x", "z"], 2)] == [job]  # z loaded for it meanwhile
        rows = {r.box: r for r in await b.boxes()}
        assert set(rows["a"].resident) == {"x", "z"}, rows["a"]
        assert holders_by_circuit(rows.values(), exclude="b") == {"x": 1, "z": 1}
        assert await a.complete(job, b"proof")
        for box in (a, b):
            await box.close()

    run(main())


def test_a_full_box_that_finished_its_job_stays_a_holder_of_its_keys(fleet_dsn: str, tmp_path: Path) -> None:
    """A box whose row says it has no free slot (its heartbeat came while it was full) and whose job then
    ended is not taken for one that claims nothing (a degraded engine, see holders_by_circuit) until its
    next heartbeat: its next claim gives its row the free slot, and other boxes count it as a holder."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a", heartbeats=False), await connect(fleet_dsn, "b", heartbeats=False)
        job = (await b.submit(None, "x", inp.ref, inp.sha256)).job_id
        assert [c.job_id for c in await a.claim(["x"], 1)] == [job]
        assert await a.claim(["x"], 0) == [] and await a.heartbeat() == []  # full: its row shows no free slot
        assert await a.complete(job, b"proof")
        assert await a.claim(["x"], 1) == []  # a slot free again, nothing to claim
        assert holders_by_circuit(await b.boxes(), exclude="b") == {"x": 1}
        for box in (a, b):
            await box.close()

    run(main())


def test_two_processes_with_one_box_name_keep_their_claims_apart(fleet_dsn: str, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    inputs = make_inputs(tmp_path, 2)

    async def main() -> None:
        first = await connect(fleet_dsn, "twin", heartbeats=False)
        for inp in inputs:
            await first.submit(None, "x", inp.ref, inp.sha256)
        [mine] = await first.claim(["x"], 1)
        second = await connect(fleet_dsn, "twin", heartbeats=False)  # takes the name over
        [theirs] = await second.claim(["x"], 1)
        assert await first.heartbeat() == [] and await second.heartbeat() == []
        assert "another process took over box name twin" in caplog.text
        assert await first.complete(mine.job_id, b"1") and await second.complete(theirs.job_id, b"2")
        await second.close()  # the taker leaves: the first process, still working, holds the name again
        await first.heartbeat()
        assert "box name twin is free again" in caplog.text
        [row] = [b for b in await first.boxes() if b.box == "twin"]
        assert row.state == "up" and row.pid == os.getpid()
        await first.close()

    run(main())


def test_close_ends_a_heartbeat_whose_cancel_became_a_database_error(fleet_dsn: str) -> None:
    """A cancel that lands inside the heartbeat's query surfaces as a database error (psycopg cancels
    the query: QueryCanceled), not as CancelledError: close() must still end the loop and return."""
    from cuzk_mp.errors import ResourceError

    async def main() -> None:
        box = await connect(fleet_dsn, "hb", heartbeat_interval_s=0.01)
        inside = asyncio.Event()

        async def heartbeat_swallowing_the_cancel() -> None:
            inside.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise ResourceError("fleet: database: QueryCanceled: canceling statement due to user request") \
                    from None

        box.heartbeat = heartbeat_swallowing_the_cancel  # type: ignore[method-assign]
        await asyncio.wait_for(inside.wait(), 10)
        await asyncio.wait_for(box.close(), 10)  # returned: the loop saw the box closed

    run(main())


@pytest.mark.parametrize("settle", ["cancel", "complete"])
def test_a_claim_racing_a_cancel_or_a_late_result_deadlocks_neither(fleet_dsn: str, tmp_path: Path,
                                                                    settle: str) -> None:
    """A claim locks the queue row, then the job row; a cancel or a result must take them in the same
    order, or PostgreSQL breaks the deadlock by failing one of the two (deadlock_timeout, 1 s)."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        b = await connect(fleet_dsn, "b", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        if settle == "complete":  # a's claim lapses; b re-picks it while a finishes anyway
            await a.claim(["x"], 1)
            await asyncio.sleep(1.2)
        picked, go = asyncio.Event(), asyncio.Event()
        make_queries = b._queries

        def pausing_queries(conn):  # type: ignore[no-untyped-def]
            queries = make_queries(conn)
            dequeue = queries.dequeue

            async def dequeue_then_wait(**kw):  # type: ignore[no-untyped-def]
                jobs = await dequeue(**kw)  # the queue row is locked until the claim commits
                picked.set()
                await go.wait()
                return jobs
            queries.dequeue = dequeue_then_wait  # type: ignore[method-assign]
            return queries

        b._queries = pausing_queries  # type: ignore[method-assign]
        claim = asyncio.create_task(b.claim(["x"], 1))
        await picked.wait()
        other = asyncio.create_task(a.cancel(ref.job_id) if settle == "cancel" else a.complete(ref.job_id, b"a"))
        await asyncio.sleep(0.3)  # the cancel or the result waits on the claim's lock
        go.set()
        [c] = await claim
        assert await other
        st = await a.status(ref.job_id)
        assert (st.state, st.claims) == (("cancelled", 1) if settle == "cancel" else ("done", 2))
        b._queries = make_queries  # type: ignore[method-assign]
        await b.heartbeat()  # the claim is b's no more (a cancel's NOTIFY may have told it already)
        assert c.aborted.is_set() and not b.held()
        for f in (a, b):
            await f.close()

    run(main())


def test_prune_forgets_a_box_that_stopped_heartbeating_without_leaving(fleet_dsn: str, tmp_path: Path) -> None:
    """A box killed without leaving goes once its heartbeat is older than the retention and it
    holds no claim; one still holding a claim stays listed, and a box that was only hung joins
    again at its next heartbeat."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        dead, holder, live = [await connect(fleet_dsn, name, heartbeats=False) for name in ("dead", "holder", "live")]
        await holder.submit(None, "x", inp.ref, inp.sha256)
        assert len(await holder.claim(["x"], 1)) == 1
        query_one(fleet_dsn, "UPDATE cuzk_fleet_boxes SET last_heartbeat = now() - interval '2 hours' "
                             "WHERE box IN ('dead', 'holder') RETURNING 1")
        assert {b.box: b.state for b in await live.boxes()} == {"dead": "stale", "holder": "stale", "live": "up"}
        await live.prune(3 * 3600)  # not yet older than the retention
        assert [b.box for b in await live.boxes()] == ["dead", "holder", "live"]
        await live.prune(3600)
        assert [b.box for b in await live.boxes()] == ["holder", "live"]
        assert await dead.heartbeat() == []  # it was only hung: it joins again
        assert {b.box: b.state for b in await live.boxes()} == {"dead": "up", "holder": "stale", "live": "up"}
        assert not dead._name_lost
        for f in (dead, holder, live):
            await f.close()

    run(main())


def test_a_heartbeat_never_stops_a_claim_made_again_while_it_ran(fleet_dsn: str, tmp_path: Path) -> None:
    """A heartbeat that read a job as "returned to the queue" (this box failed it for a retry) must
    not stop the claim this box made of it again before that heartbeat ended: stopped, the job lay
    running under nobody's renewal until the stall timeout."""
    from contextlib import asynccontextmanager

    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", heartbeats=False)
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        await a.claim(["x"], 1)
        steps = [asyncio.Event() for _ in range(4)]  # heartbeat at its read, go on, read done, go on
        tx = a._tx

        @asynccontextmanager
        async def pausing_tx():  # type: ignore[no-untyped-def]
            steps[0].set()
            await steps[1].wait()
            async with tx() as got:
                yield got
                steps[2].set()
                await steps[3].wait()

        a._tx = pausing_tx  # type: ignore[method-assign]
        beat = asyncio.create_task(a.heartbeat())
        await steps[0].wait()
        a._tx = tx  # type: ignore[method-assign]
        assert await a.fail(ref.job_id, "prover died", error_kind="WorkerDied") == Failed("queued", recorded=True)
        steps[1].set()
        await steps[2].wait()  # the heartbeat read the job as queued
        await asyncio.sleep(0.05)
        [again] = await a.claim(["x"], 1)
        steps[3].set()
        await beat
        assert not again.aborted.is_set() and a.held() == [again]
        assert await a.heartbeat() == []
        assert await a.complete(ref.job_id, b"r")
        await a.close()

    run(main())


def test_a_run_whose_error_the_database_cannot_take_as_text_still_ends(fleet_dsn: str, tmp_path: Path) -> None:
    """An error may quote anything (a circuit's message, a file name): a NUL or an unpaired surrogate
    in it is stored escaped. Refused by the database, the failure was never recorded and the box
    renewed the claim of a job that no longer ran, for ever."""
    [nul, surrogate] = make_inputs(tmp_path, 2)

    async def main() -> None:
        a = await connect(fleet_dsn, "a", max_attempts=1)
        errors = {(await a.submit(None, "x", i.ref, i.sha256)).job_id: e for i, e in (
            (nul, ProofError("the prover said a\0b")), (surrogate, InputError("no such file: /in/\udcff.json")))}

        async def run_job(c):  # type: ignore[no-untyped-def]
            raise errors[c.job_id]

        stop = asyncio.Event()
        task = asyncio.create_task(worker(a, run_job, resident=lambda: ["x"], capacity=lambda: 2).run(stop))
        ended = [await a.await_result(j, 5) for j in errors]
        stop.set()
        await task
        assert [(st.state, st.error) for st in ended] == [
            ("failed", "the prover said a\\x00b"), ("failed", "no such file: /in/\\udcff.json")]
        assert a.held() == []
        await a.close()

    run(main())


def test_a_job_whose_boxes_keep_dying_under_it_fails_once_its_attempts_are_used(
        fleet_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run that ends with its box gone (its claim lapsed) is an attempt: a job that kills every box
    that runs it (a circuit that exhausts memory) ends failed after max_attempts, instead of being
    taken over by box after box for ever."""
    [inp] = make_inputs(tmp_path, 1)
    lapse = {"heartbeats": False, "heartbeat_interval_s": 0.3, "stall_timeout_s": 1.0, "max_attempts": 2}
    caplog.set_level("INFO", logger="cuzk_mp.daemon.fleet")

    async def main() -> None:
        a, b, c = [await connect(fleet_dsn, box, **lapse) for box in "abc"]
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        [first] = await a.claim(["x"], 1)
        await asyncio.sleep(1.3)  # a dies: its claim lapses
        [second] = await b.claim(["x"], 1)
        assert (first.attempts, second.attempts, second.claims) == (0, 1, 2)
        assert "claimed job %s again (claim 2, attempt 2): its previous box stopped" % ref.job_id in caplog.text
        await asyncio.sleep(1.3)  # b dies too, and that was the last attempt
        assert await c.claim(["x"], 1) == []
        st = await c.await_result(ref.job_id, 5)
        assert (st.state, st.attempts, st.error_kind) == ("failed", 2, "WorkerDied")
        assert "box b stopped renewing its claim" in (st.error or "") and "not run again" in (st.error or "")
        assert await c.claim(["x"], 1) == [] and await b.complete(ref.job_id, b"late") is False
        for f in (a, b, c):
            await f.close()

    run(main())


def test_a_claim_lapses_by_the_longest_stall_timeout_of_the_fleet(fleet_dsn: str, tmp_path: Path) -> None:
    """Boxes configured apart: a box that would take over after 1 s of silence does not take a job from
    a live box whose own stall timeout is 3 s (it may renew that rarely); once that much has passed
    without a renewal, it does."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        slow = await connect(fleet_dsn, "slow", heartbeats=False, **STALLING)  # renews rarely: here, not at all
        quick = await connect(fleet_dsn, "quick", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        ref = await quick.submit(None, "x", inp.ref, inp.sha256)
        [held] = await slow.claim(["x"], 1)
        await asyncio.sleep(1.5)  # past quick's own stall timeout, within slow's
        assert await quick.claim(["x"], 1) == []
        await asyncio.sleep(STALLING["stall_timeout_s"] - 1.5 + 0.3)
        [again] = await quick.claim(["x"], 1)
        assert (again.job_id, again.claims) == (ref.job_id, 2) and held.claims == 1
        for f in (slow, quick):
            await f.close()

    run(main())


def test_a_dead_box_with_a_long_stall_timeout_no_longer_delays_every_takeover(fleet_dsn: str, tmp_path: Path) -> None:
    """A box with a long stall timeout dies without leaving (SIGKILL: its row stays until pruned). Once
    it has been silent for longer than its own timeout, its timeout no longer counts: a job of another
    dead box, with a short one, is taken over after that box's timeout, not the long one."""
    import psycopg

    [inp] = make_inputs(tmp_path, 1)

    async def die(box: Any) -> None:  # its connections end, its row stays: never left
        await box._events.close()
        await box._pool.close()

    async def main() -> None:
        await die(await connect(fleet_dsn, "long", heartbeats=False, stall_timeout_s=60.0))
        quick = await connect(fleet_dsn, "quick", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        dead = await connect(fleet_dsn, "dead", heartbeats=False, heartbeat_interval_s=0.3, stall_timeout_s=1.0)
        ref = await quick.submit(None, "x", inp.ref, inp.sha256)
        [held] = await dead.claim(["x"], 1)
        await die(dead)
        async with await psycopg.AsyncConnection.connect(fleet_dsn, autocommit=True) as conn:
            await conn.execute("UPDATE cuzk_fleet_boxes SET last_heartbeat = now() - interval '61 seconds' "
                               "WHERE box = 'long'")
        await asyncio.sleep(1.5)  # past the dead box's stall timeout
        await quick.heartbeat()
        [again] = await quick.claim(["x"], 1)
        assert (again.job_id, again.claims) == (ref.job_id, 2) and held.claims == 1
        await quick.close()

    run(main())
