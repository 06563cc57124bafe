"""What the fleet makes of each box's row: whether it is up, and how long a key it loads counts as held."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet_helpers import connect, make_inputs

from cuzk_mp.daemon.fleet import report


def _age(dsn: str, box: str, age_s: float, stall_s: float | None = None) -> None:
    """Box ``box`` last heartbeat ``age_s`` ago (and, given, recorded ``stall_s`` as its stall timeout)."""
    import psycopg
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE cuzk_fleet_boxes SET last_heartbeat = now() - make_interval(secs => %s), "
                     "stall_timeout_s = COALESCE(%s, stall_timeout_s) WHERE box = %s", (age_s, stall_s, box))


def test_each_box_is_stale_by_its_own_stall_timeout(fleet_dsn: str) -> None:
    """Boxes of one fleet may run different stall timeouts: each is judged by the one its row records,
    whoever reads it. A row of a release before that column (0 there) is judged by the reader's own."""

    async def main() -> None:
        reader = await connect(fleet_dsn, "reader", stall_timeout_s=10.0, heartbeats=False)
        boxes = {name: await connect(fleet_dsn, name, stall_timeout_s=stall, heartbeats=False)
                 for name, stall in (("patient", 60.0), ("hasty", 3.0), ("old", 3.0))}
        _age(fleet_dsn, "patient", 20.0)  # older than the reader's 10 s, within its own 60 s
        _age(fleet_dsn, "hasty", 5.0)  # within the reader's 10 s, older than its own 3 s
        _age(fleet_dsn, "old", 5.0, stall_s=0.0)
        states = {b.box: b.state for b in await reader.boxes()}
        assert states == {"reader": "up", "patient": "up", "hasty": "stale", "old": "up"}, states
        _age(fleet_dsn, "old", 15.0)
        assert {b.box: b.state for b in await reader.boxes()}["old"] == "stale"
        up = {name: values for name, _, values in report.gauges(await reader.boxes(), [])}["cuzk_fleet_box_up"]
        assert {dict(labels)["box"]: v for labels, v in up.items()} == {"reader": 1.0, "patient": 1.0, "hasty": 0.0,
                                                                       "old": 0.0}
        for f in (reader, *boxes.values()):
            await f.close()

    asyncio.run(main())


def test_a_job_counts_as_stalled_only_once_its_claim_lapses_in_the_fleet(fleet_dsn: str, tmp_path: Path) -> None:
    """A job running on a box whose stall timeout is longer than the reader's, renewed later than the
    reader's timeout but within its box's, is running, not stalled: no box takes it over yet (a claim
    lapses by the longest stall timeout of the fleet), so it is no backlog for the key-loading decision,
    and fleet status and the metrics do not show it stalled."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        reader = await connect(fleet_dsn, "reader", stall_timeout_s=10.0, heartbeats=False)
        patient = await connect(fleet_dsn, "patient", stall_timeout_s=60.0, heartbeats=False)
        await reader.submit(None, "x", inp.ref, inp.sha256)
        [c] = await patient.claim(["x"], 1)
        _age_claims(fleet_dsn, 20.0)
        _age(fleet_dsn, "patient", 5.0)
        [d] = await reader.queue_depths()
        assert (d.circuit_id, d.queued, d.running, d.stalled) == ("x", 0, 1, 0), d
        await reader.heartbeat()  # learns the fleet's longest stall timeout
        assert await reader.claim(["x"], 1) == []  # indeed: not taken over
        _age(fleet_dsn, "patient", 61.0)  # dead by its own timeout: the fleet's claims lapse by the reader's
        _age_claims(fleet_dsn, 11.0)
        [d] = await reader.queue_depths()
        assert (d.queued, d.running, d.stalled) == (0, 0, 1), d
        for f in (reader, patient):
            await f.close()

    asyncio.run(main())


def _age_claims(dsn: str, age_s: float) -> None:
    """Every claim of the queue last renewed ``age_s`` ago."""
    import psycopg
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE cuzk_pgqueuer SET heartbeat = now() - make_interval(secs => %s) WHERE status = 'picked'",
                     (age_s,))


def test_prune_keeps_a_box_within_its_own_stall_timeout(fleet_dsn: str) -> None:
    """A box that never left goes at a prune once its heartbeat is older than the retention and every
    stall timeout that applies: the pruner's and the box's own. A box whose own timeout is the longer is
    hung at worst until then, and keeps its row (its claims lapse by it too)."""

    async def main() -> list[str]:
        pruner = await connect(fleet_dsn, "pruner", stall_timeout_s=2.0, heartbeats=False)
        boxes = [await connect(fleet_dsn, name, stall_timeout_s=stall, heartbeats=False)
                 for name, stall in (("patient", 600.0), ("hasty", 2.0))]
        _age(fleet_dsn, "patient", 30.0)
        _age(fleet_dsn, "hasty", 30.0)
        await pruner.prune(1.0)
        left = [b.box for b in await pruner.boxes()]
        for f in (pruner, *boxes):
            await f.close()
        return left

    assert asyncio.run(main()) == ["patient", "pruner"]
