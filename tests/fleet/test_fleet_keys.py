"""The key-loading decision of an idle box: pure rules, then fed from a real fleet's depths and boxes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import types
from pathlib import Path
from typing import Any, cast

import pytest
from fleet_helpers import FAST, connect, instant_jobs, make_inputs

from cuzk_mp.daemon.fleet import report
from cuzk_mp.daemon.fleet.keys import (
    KeyView,
    backlog_by_circuit,
    holders_by_circuit,
    plan_key_load,
)
from cuzk_mp.errors import ResourceError

GIB = 1 << 30


def view(resident: tuple[str, ...], *, busy: tuple[str, ...] = (), provable: str = "abcd",
         budget_gib: int = 2, sizes: dict[str, int] | None = None) -> KeyView:
    sizes = sizes or {}
    return KeyView(resident=resident, busy=frozenset(busy), provable=frozenset(provable),
                   key_bytes={c: sizes.get(c, 1) * GIB for c in provable}, budget_bytes=budget_gib * GIB)


def test_loads_an_unheld_backlog_into_free_budget() -> None:
    d = plan_key_load(view(("a",)), {"b": 1}, {})
    assert (d.load, d.evict) == ("b", ())
    assert "no live box holds it" in d.reason


def test_evicts_least_recently_used_idle_keys_to_make_room() -> None:
    d = plan_key_load(view(("a", "b")), {"c": 3}, {})
    assert (d.load, d.evict) == ("c", ("a",))
    d = plan_key_load(view(("a", "b"), busy=("a",)), {"c": 3}, {})
    assert (d.load, d.evict) == ("c", ("b",))
    d = plan_key_load(view(("a", "b"), sizes={"c": 2}), {"c": 3}, {})
    assert (d.load, d.evict) == ("c", ("a", "b"))


def test_never_evicts_a_key_in_use_or_with_its_own_backlog() -> None:
    d = plan_key_load(view(("a", "b"), busy=("a", "b")), {"c": 9}, {})
    assert d.load is None and "fits the budget" in d.reason
    d = plan_key_load(view(("a", "b"), sizes={"c": 3}), {"c": 9}, {})
    assert d.load is None


def test_claims_its_own_backlog_before_loading_anything() -> None:
    d = plan_key_load(view(("a",)), {"a": 1, "b": 50}, {})
    assert d.load is None and "claim it first" in d.reason


def test_unheld_circuits_first_then_backlog_per_holder() -> None:
    assert plan_key_load(view(()), {"b": 100, "c": 1}, {"b": 2}).load == "c"
    assert plan_key_load(view(()), {"b": 100, "c": 30}, {"b": 2, "c": 1}).load == "b"  # 33 vs 15 per box


def test_a_small_backlog_held_elsewhere_is_left_to_its_holders() -> None:
    assert plan_key_load(view(()), {"b": 3}, {"b": 2}).load is None  # 3 < 2 per holder x 2 holders
    assert plan_key_load(view(()), {"b": 4}, {"b": 2}).load == "b"
    assert plan_key_load(view((), provable="a"), {"b": 99}, {}).load is None  # cannot prove b here


def test_decision_from_a_real_fleet(fleet_dsn: str, tmp_path: Path) -> None:
    """An idle box holding x sees y's backlog that no live box holds, and decides to swap x for y."""
    inputs = make_inputs(tmp_path, 4)

    async def main() -> None:
        idle = await connect(fleet_dsn, "idle")
        other = await connect(fleet_dsn, "other")
        for inp in inputs[:3]:
            await other.submit(None, "y", inp.ref, inp.sha256)
        await other.submit(None, "x", inputs[3].ref, inputs[3].sha256)
        [cx] = await idle.claim(["x"], 2)  # its own circuit's job first
        assert await idle.complete(cx.job_id, b"x")
        assert await idle.claim(["x"], 2) == []  # idle now, y waits
        await other.claim(["z"], 1)
        await asyncio.gather(idle.heartbeat(), other.heartbeat())
        backlog = backlog_by_circuit(await idle.queue_depths())
        holders = holders_by_circuit(await idle.boxes(), exclude="idle")
        assert backlog == {"y": 3} and holders == {"z": 1}
        d = plan_key_load(KeyView(resident=("x",), busy=frozenset(), provable=frozenset("xy"),
                                  key_bytes={"x": GIB, "y": GIB}, budget_bytes=GIB), backlog, holders)
        assert (d.load, d.evict) == ("y", ("x",))
        got = await idle.claim(["y"], 3)
        assert {c.circuit_id for c in got} == {"y"} and len(got) == 3
        await idle.close()
        await other.close()

    asyncio.run(main())


def test_a_box_that_claims_nothing_holds_no_key_for_the_backlog() -> None:
    """A box up but claiming nothing (paused for its shared folder; its engine degraded: no free slot,
    no job running) is no holder: one job of its circuit is loaded elsewhere rather than wait on it."""
    from cuzk_mp.daemon.fleet.models import BoxInfo

    def box(name: str, free_slots: int, running: int, paused: str | None = None) -> BoxInfo:
        return BoxInfo(box=name, state="up", host="h", pid=1, resident=("b",), free_slots=free_slots,
                       running=running, started_at=0.0, heartbeat_age_s=0.0, paused=paused)

    claiming = [box("idle", 1, 0), box("busy", 0, 1)]
    not_claiming = [box("paused", 1, 0, paused="[fleet] inputs_dir /s: no marker"), box("degraded", 0, 0)]
    assert holders_by_circuit(claiming + not_claiming) == {"b": 2}
    d = plan_key_load(view(("a",)), {"b": 1}, holders_by_circuit(not_claiming))
    assert d.load == "b" and "no live box holds it" in d.reason


class _SlowKeys:
    """An engine whose key loads wait for ``release`` (set from the test) and are recorded; idle otherwise."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.loads: list[str] = []
        self.evicted: list[str] = []
        self.fail = False

    def preload(self, circuit_id: str) -> None:
        self.loads.append(circuit_id)
        self.started.set()
        assert self.release.wait(30), "the test never released the key load"
        if self.fail:
            raise ResourceError(f"the key of {circuit_id} could not be read")

    def evict(self, circuit_id: str) -> bool:
        self.evicted.append(circuit_id)
        return True

    def degraded(self) -> bool:
        return False


def _key_box(dsn: str, name: str, key_bytes: int = GIB, circuits: str = "y", budget: int | None = None,
             **knobs: Any) -> tuple[Any, _SlowKeys]:
    """A FleetBox of ``circuits`` (circuit y alone unless told; no key resident, the key ``budget`` in
    bytes, none unless told) over a slow-loading engine whose jobs end at once; ``knobs`` override FAST's."""
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.config import FleetConfig

    engine = _SlowKeys()
    _, jobs = instant_jobs()
    cfg = types.SimpleNamespace(fleet=FleetConfig(dsn=dsn, box=name, **{**FAST, **knobs}),
                                circuits={c: object() for c in circuits},
                                engine=types.SimpleNamespace(srs_budget_bytes=budget), param_cache=None)
    box = FleetBox(cast(Any, cfg), engine, jobs)
    box._key_bytes = lambda: dict.fromkeys(circuits, key_bytes)  # type: ignore[method-assign]
    return box, engine


def _loading_rows(dsn: str) -> dict[str, list[str]]:
    import psycopg
    with psycopg.connect(dsn) as conn:
        return {r[0]: list(r[1]) for r in conn.execute("SELECT box, loading FROM cuzk_fleet_boxes")}


def test_a_key_a_box_is_loading_is_not_loaded_again_by_another_idle_box(fleet_dsn: str, tmp_path: Path) -> None:
    """Box a loads y's key for its one waiting job; box b, idle meanwhile, sees a as y's holder (its row
    says it is loading y) and leaves that job to it. Once the load ends the row says y is resident."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        (a, a_engine), (b, b_engine) = _key_box(fleet_dsn, "a"), _key_box(fleet_dsn, "b")
        a.fleet, b.fleet = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        b_engine.release.set()  # b loads at once, if it decides to
        loading = asyncio.create_task(a._plan_and_load(a.fleet, 0.0))
        try:
            assert await asyncio.to_thread(a_engine.started.wait, 20)
            await b._plan_and_load(b.fleet, 0.0)
            assert b_engine.loads == []
            assert _loading_rows(fleet_dsn)["a"] == ["y"]
            [line] = [ln for ln in report.text(await submitter.boxes(), []).splitlines() if ln.startswith("a ")]
            assert line.endswith("- (loading y)"), line  # fleet status: no key resident yet, y loading
        finally:
            a_engine.release.set()
        await loading
        assert a_engine.loads == ["y"] and a.resident() == ("y",)
        [row] = [x for x in await submitter.boxes() if x.box == "a"]
        assert (row.loading, row.resident) == ((), ("y",))
        for f in (submitter, a.fleet, b.fleet):
            await f.close()

    asyncio.run(main())


def test_two_idle_boxes_deciding_at_once_load_one_key_once(fleet_dsn: str, tmp_path: Path) -> None:
    """A submit wakes every idle box at the same moment: one box decides at a time (one that finds
    another deciding decides again at its next idle check, when it sees that box's load), so only one
    of them loads the key of one waiting job, and the other ends without loading."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        boxes = [_key_box(fleet_dsn, name) for name in ("a", "b")]
        for box, _ in boxes:
            box.fleet = await connect(fleet_dsn, box.fcfg.box)
        tasks = [asyncio.create_task(box._plan_and_load(box.fleet, 0.0)) for box, _ in boxes]
        try:
            done, pending = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1 and len(pending) == 1, "both boxes went on to load the key"
        finally:
            for _, engine in boxes:
                engine.release.set()
        await asyncio.gather(*tasks)
        assert sorted(len(engine.loads) for _, engine in boxes) == [0, 1]
        for f in (submitter, *(box.fleet for box, _ in boxes)):
            await f.close()

    asyncio.run(main())


def test_a_failed_load_or_a_stopped_box_leaves_no_load_on_its_row(fleet_dsn: str, tmp_path: Path) -> None:
    """A load that fails clears the box's loading entry (another box may take the key on); so does the
    box's stop in the middle of one."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        box, engine = _key_box(fleet_dsn, "a")
        box.fleet = await connect(fleet_dsn, "a")
        engine.fail = True
        engine.release.set()
        with pytest.raises(ResourceError, match="could not be read"):
            await box._plan_and_load(box.fleet, 0.0)
        assert _loading_rows(fleet_dsn)["a"] == [] and box.resident() == ()

        engine.fail, engine.loads = False, []
        engine.release.clear()
        engine.started.clear()
        box._next_load = 0.0
        loading = asyncio.create_task(box._plan_and_load(box.fleet, 0.0))
        assert await asyncio.to_thread(engine.started.wait, 20)
        assert _loading_rows(fleet_dsn)["a"] == ["y"]
        await box.fleet.close()  # the box stops while its key loads
        assert _loading_rows(fleet_dsn)["a"] == []
        engine.release.set()
        with contextlib.suppress(ResourceError):
            await loading
        await submitter.close()

    asyncio.run(main())


def test_only_a_live_box_counts_as_the_holder_of_a_key_it_loads() -> None:
    """A box loading a key holds it for the decision, as one holding it resident does; a box whose
    heartbeat stopped (dead mid-load), that left or that is paused holds nothing it was loading."""
    from cuzk_mp.daemon.fleet.models import BoxInfo

    def box(name: str, state: Any = "up", free_slots: int = 1, paused: str | None = None) -> BoxInfo:
        return BoxInfo(box=name, state=state, host="h", pid=1, resident=(), free_slots=free_slots, running=0,
                       started_at=0.0, heartbeat_age_s=0.0, paused=paused, loading=("b",))

    assert holders_by_circuit([box("up")]) == {"b": 1}
    assert holders_by_circuit([box("fresh", free_slots=0)]) == {"b": 1}  # its slots not written yet
    assert holders_by_circuit([box("dead", "stale"), box("gone", "left"), box("paused", paused="no share")]) == {}
    d = plan_key_load(view(("a",)), {"b": 1}, holders_by_circuit([box("up")]))
    assert d.load is None


def test_a_box_frozen_while_it_decides_holds_back_no_other_boxs_claims(fleet_dsn: str, tmp_path: Path) -> None:
    """A box frozen (SIGSTOP, a debugger) inside its key-loading decision holds the fleet's decision lock
    until the server ends its session, as long as the stall timeout: another idle box's decision, taken
    by its claim loop, must not wait for it (its claims would wait with it). It decides nothing this
    time and asks again at its next idle check."""
    import psycopg

    from cuzk_mp.daemon.fleet.schema import KEY_LOAD_LOCK_KEY

    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        box, engine = _key_box(fleet_dsn, "b")
        engine.release.set()
        box.fleet = await connect(fleet_dsn, "b")
        async with await psycopg.AsyncConnection.connect(fleet_dsn) as frozen:  # a transaction left open
            await frozen.execute("SELECT pg_advisory_xact_lock(%s)", (KEY_LOAD_LOCK_KEY,))
            await asyncio.wait_for(box._plan_and_load(box.fleet, 0.0), 10)
            assert engine.loads == []
        await box._plan_and_load(box.fleet, 0.0)  # the lock is free again: b takes the key on
        assert engine.loads == ["y"]
        for f in (submitter, box.fleet):
            await f.close()

    asyncio.run(main())


def test_a_load_that_hangs_holds_its_key_for_a_bounded_time(fleet_dsn: str, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A key load that never ends (a hard mount whose server is gone) counts as its key's holder only
    for its limit (:func:`~cuzk_mp.daemon.fleet.keys.load_limit_s`: here the floor, twice the 1.5 s stall
    timeout, for a key of no size): past it another idle box loads the key for the waiting job, and the
    loading box says so in its log. ``fleet status`` shows the load as past its limit."""
    from cuzk_mp.daemon.fleet.keys import load_limit_s

    [inp] = make_inputs(tmp_path, 1)
    quick = {"heartbeat_interval_s": 0.5, "stall_timeout_s": 1.5}
    limit = load_limit_s(0, quick["stall_timeout_s"])
    assert limit == 3.0

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        (a, a_engine), (b, b_engine) = _key_box(fleet_dsn, "a", 0, **quick), _key_box(fleet_dsn, "b", 0, **quick)
        a.fleet, b.fleet = await connect(fleet_dsn, "a", **quick), await connect(fleet_dsn, "b", **quick)
        b_engine.release.set()
        loading = asyncio.create_task(a._plan_and_load(a.fleet, 0.0))
        try:
            assert await asyncio.to_thread(a_engine.started.wait, 20)
            await b._plan_and_load(b.fleet, 0.0)
            assert b_engine.loads == []  # within its limit, a's load holds the key
            await asyncio.sleep(limit + 0.5)
            [row] = [x for x in await submitter.boxes() if x.box == "a"]
            assert row.loading == ("y",) and row.load_overdue, row
            [line] = [ln for ln in report.text(await submitter.boxes(), []).splitlines() if ln.startswith("a ")]
            assert "past its 3 s limit" in line, line
            await b._plan_and_load(b.fleet, 0.0)
            assert b_engine.loads == ["y"]
            for _ in range(100):  # a's own timer, on this loop: it may come a moment later on a busy machine
                if any(r.levelname == "ERROR" and "loading the key of y" in r.getMessage() and "limit" in r.getMessage()
                       for r in caplog.records):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"box a never logged its overdue load: {[r.getMessage() for r in caplog.records]}")
        finally:
            a_engine.release.set()
        await loading
        assert _loading_rows(fleet_dsn)["a"] == [] and a.resident() == ("y",)
        for f in (submitter, a.fleet, b.fleet):
            await f.close()

    asyncio.run(main())


def test_a_box_stops_while_a_key_load_hangs(fleet_dsn: str, tmp_path: Path) -> None:
    """A box's stop does not wait for a key load for ever (a hard mount whose server is gone): past a
    short wait the load is left to the engine's thread, the box leaves the fleet with no load on its
    row, and stops."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)
        box, engine = _key_box(fleet_dsn, "a")
        try:
            await box.start([])
            assert await asyncio.to_thread(engine.started.wait, 20)  # the claim loop's idle hook loads y
            assert _loading_rows(fleet_dsn)["a"] == ["y"]
            await asyncio.wait_for(box.stop(0.0), 20)
            assert _loading_rows(fleet_dsn)["a"] == [] and box.resident() == ()
            [row] = [x for x in await submitter.boxes() if x.box == "a"]
            assert row.state == "left"
        finally:
            engine.release.set()
        await submitter.close()

    asyncio.run(main())


def test_a_box_claims_jobs_of_its_resident_keys_while_it_loads_a_key(fleet_dsn: str, tmp_path: Path) -> None:
    """A key load for the backlog takes minutes for a large key (for ever on a hung mount); the box's row
    shows free slots and its resident keys meanwhile, so the other boxes count it as their holder. Its
    claim loop goes on claiming the jobs of those keys during the load, and claims the loaded key's jobs
    once it ends."""
    import msgspec

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet.inputs import store_inputs

    waiting, resident_job = (store_inputs(msgspec.msgpack.encode([P.PartitionIn(kind="synthetic", seed=i)]),
                                          tmp_path) for i in range(2))

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        y_job = await submitter.submit(None, "y", waiting.ref, waiting.sha256)  # no box holds y: a loads it
        box, engine = _key_box(fleet_dsn, "a", circuits="xy")
        try:
            await box.start(["x"])
            assert await asyncio.to_thread(engine.started.wait, 20)
            assert engine.loads == ["y"] and _loading_rows(fleet_dsn)["a"] == ["y"]
            x_job = await submitter.submit(None, "x", resident_job.ref, resident_job.sha256)
            st = await submitter.await_result(x_job.job_id, 15)
            assert st.state == "done", f"the job of resident key x waited for the load of y: {st}"
            assert (await submitter.status(y_job.job_id)).state == "queued" and not engine.release.is_set()
            engine.release.set()
            assert (await submitter.await_result(y_job.job_id, 15)).state == "done"  # claimed once y is resident
            assert box.resident() == ("x", "y") and _loading_rows(fleet_dsn)["a"] == []
        finally:
            engine.release.set()
            await box.stop(0.0)
            await submitter.close()

    asyncio.run(main())



def test_a_key_to_evict_for_a_load_is_claimed_no_more_or_spared_if_a_job_of_it_came(fleet_dsn: str,
                                                                                      tmp_path: Path) -> None:
    """The claim loop goes on during a key load: a key the decision evicts to make room leaves the box's
    resident keys before the engine drops it (no job of it is claimed meanwhile, to run without its
    key); where a job of it was claimed while the decision was taken, the box evicts and loads nothing
    this time, its row left with no load."""
    x_inputs, y_inputs = make_inputs(tmp_path, 2)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", y_inputs.ref, y_inputs.sha256)  # no box holds y
        box, engine = _key_box(fleet_dsn, "a", circuits="xy", budget=GIB)  # room for one key: x must go
        box.loaded("x")
        box.fleet = await connect(fleet_dsn, "a")
        real_plan = box.fleet.plan_load

        async def claim_x_while_deciding(*args: Any) -> Any:
            decision = await real_plan(*args)
            await submitter.submit(None, "x", x_inputs.ref, x_inputs.sha256)
            [c] = await box.fleet.claim(box.resident(), 1)  # the claim loop, meanwhile
            assert c.circuit_id == "x"
            return decision

        box.fleet.plan_load = claim_x_while_deciding
        await box._plan_and_load(box.fleet, 0.0)
        assert (engine.evicted, engine.loads, box.resident()) == ([], [], ("x",))
        assert _loading_rows(fleet_dsn)["a"] == []
        [held] = box.fleet.held()
        await box.fleet.release(held.job_id)
        await submitter.cancel(held.job_id)  # x is claimed no more once evicted below

        box.fleet.plan_load, box._next_load = real_plan, 0.0
        loading = asyncio.create_task(box._plan_and_load(box.fleet, 0.0))
        try:
            assert await asyncio.to_thread(engine.started.wait, 20)
            assert (engine.evicted, engine.loads, box.resident()) == (["x"], ["y"], ())
        finally:
            engine.release.set()
        await loading
        assert box.resident() == ("y",) and _loading_rows(fleet_dsn)["a"] == []
        for f in (submitter, box.fleet):
            await f.close()

    asyncio.run(main())


_HUNG_LOAD_BOX = """
import asyncio, sys, threading, types
from fleet_helpers import FAST, instant_jobs
from cuzk_mp.daemon.fleet.box import FleetBox
from cuzk_mp.daemon.fleet.config import FleetConfig

class HungKeys:  # a key read on a hard mount whose server is gone: it never returns
    def __init__(self): self.started = threading.Event()
    def preload(self, circuit_id): self.started.set(); threading.Event().wait()
    def evict(self, circuit_id): return True
    def degraded(self): return False

async def main():
    engine, (_, jobs) = HungKeys(), instant_jobs()
    cfg = types.SimpleNamespace(fleet=FleetConfig(dsn=sys.argv[1], box="a", **FAST), circuits={"y": object()},
                                engine=types.SimpleNamespace(srs_budget_bytes=None), param_cache=None)
    box = FleetBox(cfg, engine, jobs)
    box._key_bytes = lambda: {"y": 1 << 30}
    await box.start([])
    while not engine.started.is_set():
        await asyncio.sleep(0.05)
    await box.stop(0.0)
    print("stopped", flush=True)

asyncio.run(main())
"""


def test_a_box_whose_key_load_hangs_lets_its_process_exit_after_its_stop(fleet_dsn: str, tmp_path: Path) -> None:
    """The box's stop leaves a hung key load to its thread; that thread must not keep the daemon's process
    from exiting (a thread of the loop's default executor is joined at the loop's end and at exit)."""
    from fleet_helpers import run_stopping_box

    [inp] = make_inputs(tmp_path, 1)

    async def queue_one() -> None:
        submitter = await connect(fleet_dsn, "s")
        await submitter.submit(None, "y", inp.ref, inp.sha256)  # no box holds y: the box loads it
        await submitter.close()

    asyncio.run(queue_one())
    err = run_stopping_box(_HUNG_LOAD_BOX, fleet_dsn, timeout_s=30)
    assert "stops without its load of the key of y" in err
    assert _loading_rows(fleet_dsn)["a"] == []
