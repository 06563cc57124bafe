"""The key-loading decision of an idle box: pure rules, then fed from a real fleet's depths and boxes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet_helpers import connect, make_inputs

from cuzk_mp.daemon.fleet.keys import (
    KeyView,
    backlog_by_circuit,
    holders_by_circuit,
    plan_key_load,
)

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
