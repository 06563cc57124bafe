"""The caps on unfinished jobs over a fleet's shared queue, and on a client's priority, against a
real PostgreSQL.

A box applies its ``[daemon]`` caps (``max_queued_jobs``, ``max_queued_input``,
``max_jobs_per_owner``) to the whole fleet's unfinished jobs, counted in the database in the
submit's transaction: a submit beyond one is refused with Unavailable (exit 3), worded as on a
daemon alone, a repeat is answered whatever the caps, and two submits racing at a cap from two
boxes never both pass. A client token's job asking a priority above ``[daemon] max_client_priority``
is refused at the box as on a daemon alone, before anything is stored or queued.
"""

from __future__ import annotations

import asyncio
import re
import time
import types
from pathlib import Path
from typing import Any, cast

import pytest
from fleet_helpers import connect, make_inputs, query_one

from cuzk_mp.daemon.access import OPEN, Identity
from cuzk_mp.daemon.queue_caps import Queued, QueueCaps
from cuzk_mp.errors import Unavailable
from cuzk_mp.pipeline.types import Priority

AGAIN = "; send it again once some jobs have finished"


def test_the_caps_count_every_boxs_unfinished_jobs(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 4)
    caps = QueueCaps(max_jobs=2)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        first = await a.submit("r1", "x", inputs[0].ref, inputs[0].sha256, caps=caps)
        await b.submit("r2", "x", inputs[1].ref, inputs[1].sha256, caps=caps)
        full = f"the fleet holds 2 unfinished jobs (queued or running), its cap ([daemon] max_queued_jobs = 2){AGAIN}"
        for box in (a, b):
            with pytest.raises(Unavailable, match=f"^{re.escape(full)}$"):
                await box.submit("r3", "x", inputs[2].ref, inputs[2].sha256, caps=caps)
            with pytest.raises(Unavailable, match=re.escape(full)):
                await box.precheck("r3", "", 0, caps)
        again = await b.submit("r1", "x", inputs[0].ref, inputs[0].sha256, caps=caps)  # a repeat: answered
        assert (again.job_id, again.duplicate) == (first.job_id, True)
        await b.precheck("r1", "", 0, caps)
        [claimed] = await a.claim(["x"], 1)  # a running job holds its place too
        with pytest.raises(Unavailable, match=re.escape(full)):
            await a.submit("r3", "x", inputs[2].ref, inputs[2].sha256, caps=caps)
        assert await a.complete(claimed.job_id, b"proof")
        third = await b.submit("r3", "x", inputs[2].ref, inputs[2].sha256, caps=caps)  # the refused request_id
        assert not third.duplicate
        for box in (a, b):
            await box.close()

    asyncio.run(main())
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_jobs WHERE state IN ('queued', 'running')") == (2,)
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_requests") == (3,)


def test_one_clients_jobs_and_the_input_bytes_are_capped_over_the_fleet(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 6)
    caps = QueueCaps(max_input_bytes=10 << 10, max_per_owner=1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")

        async def submit(box: Any, i: int, client: str, size: int) -> Any:
            return await box.submit(None, "x", inputs[i].ref, inputs[i].sha256, client=client, input_bytes=size,
                                    caps=caps)

        await submit(a, 0, "tenant-1", 6 << 10)
        with pytest.raises(Unavailable, match=re.escape(
                "this client has 1 unfinished job (queued or running) in the fleet, its cap "
                f"([daemon] max_jobs_per_owner = 1){AGAIN}")):
            await submit(b, 1, "tenant-1", 1)
        with pytest.raises(Unavailable, match=re.escape(
                "the fleet holds 1 unfinished job with 6 KiB (6144 bytes) of inputs and this job brings 4 KiB "
                f"(4097 bytes): more than its cap ([daemon] max_queued_input = 10 KiB, 10240 bytes){AGAIN}")):
            await submit(b, 2, "tenant-2", 4097)
        await submit(b, 3, "tenant-2", 4 << 10)  # exactly at the byte cap
        while claimed := await a.claim(["x"], 4):
            for c in claimed:
                assert await a.complete(c.job_id, b"proof")
        await submit(a, 4, "tenant-1", 50 << 10)  # a fleet with no unfinished job takes any job
        for box in (a, b):
            await box.close()

    asyncio.run(main())
    assert query_one(fleet_dsn, "SELECT sum(input_bytes) FROM cuzk_fleet_jobs") == (60 << 10,)


@pytest.mark.parametrize("rotation", [0, 1])
def test_submits_racing_at_the_cap_from_several_boxes_never_all_pass(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rotation: int) -> None:
    """Every racer's count is held back until every racer has counted (or 0.5 s passed): without a
    lock around the count and the insert, all of them would count the same free place and pass."""
    from cuzk_mp.daemon.fleet.queue import Fleet

    racers, caps = 4, QueueCaps(max_jobs=3)
    inputs = make_inputs(tmp_path, racers + 1, f"race{rotation}")
    counted: list[float] = []
    all_counted = asyncio.Event()
    real = Fleet._unfinished

    async def slow_count(conn: Any, client: str) -> tuple[Queued, int]:
        figures = await real(conn, client)
        counted.append(time.monotonic())
        if len(counted) == racers:
            all_counted.set()
        try:
            await asyncio.wait_for(all_counted.wait(), 0.5)
        except TimeoutError:
            pass
        return figures

    async def main() -> list[BaseException | Any]:
        boxes = [await connect(fleet_dsn, f"b{i}") for i in range(racers)]
        await boxes[0].submit(None, "x", inputs[0].ref, inputs[0].sha256, client="t", caps=caps)
        monkeypatch.setattr(Fleet, "_unfinished", staticmethod(slow_count))
        order = boxes[rotation:] + boxes[:rotation]
        results = await asyncio.gather(*[
            box.submit(f"race-{i}", "x", inputs[i + 1].ref, inputs[i + 1].sha256, Priority.NORMAL,
                       client=f"t{i % 2}", caps=caps) for i, box in enumerate(order)], return_exceptions=True)
        for box in boxes:
            await box.close()
        return results

    results = asyncio.run(main())
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, Unavailable) for r in refused), refused
    assert len(refused) == racers - 2  # the cap of 3 less the job queued before the race
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_jobs") == (3,)
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_requests") == (2,)  # refused ones rolled back


def test_a_box_refuses_a_submit_beyond_the_caps_before_storing_its_inputs(fleet_dsn: str, tmp_path: Path) -> None:
    """Through the daemon's fleet box: its JobTable's caps, the client's exit 3, nothing left in
    ``inputs_dir`` by the refused submit."""
    from cuzk_mp.cli import exit_code
    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.config import FleetConfig
    from cuzk_mp.daemon.jobs import JobTable
    from cuzk_mp.exit_codes import EXIT_UNREACHABLE

    shared = tmp_path / "inputs"
    circuit = types.SimpleNamespace(priority=Priority.NORMAL)
    engine = types.SimpleNamespace(circuits=types.SimpleNamespace(check_job=lambda spec: None))
    jobs = JobTable(cast(Any, engine), cast(Any, None), cast(Any, {"x": circuit}), cast(Any, None), 60.0,
                    QueueCaps(max_jobs=1))
    cfg = FleetConfig(dsn=fleet_dsn, box="a", heartbeat_interval_s=0.5, inputs_dir=shared)
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": circuit})), engine, jobs)

    def wtns(tag: bytes) -> P.SubmitProof:
        return P.SubmitProof(id=1, circuit_id="x", partitions=[P.PartitionIn("wtns", b"wtns" + tag * 100)],
                             request_id=tag.decode())

    async def main() -> None:
        from cuzk_mp.daemon.fleet.queue import Fleet
        box.fleet = await Fleet.from_config(cfg, heartbeats=False)
        try:
            await box.submit(wtns(b"one"), OPEN)
            stored = sorted(shared.iterdir())
            with pytest.raises(Unavailable, match="max_queued_jobs = 1") as refused:
                await box.submit(wtns(b"two"), OPEN)
            assert sorted(shared.iterdir()) == stored
            assert exit_code(refused.value)[0] == EXIT_UNREACHABLE == 3
            assert (await box.submit(wtns(b"one"), OPEN)).duplicate
        finally:
            await box.fleet.close()

    asyncio.run(main())
    assert query_one(fleet_dsn, "SELECT input_bytes FROM cuzk_fleet_jobs") == (4 + 300,)  # its partitions' data


def test_a_box_refuses_a_client_priority_above_the_cap_before_storing_anything(fleet_dsn: str,
                                                                               tmp_path: Path) -> None:
    """Through the daemon's fleet box with ``max_client_priority`` NORMAL: a client token asking
    CRITICAL is refused (AuthError naming the key, the client's exit 2) with nothing in
    ``inputs_dir`` or the queue; the same client asking NORMAL, and an admin asking CRITICAL, are
    queued at the priority they asked."""
    from cuzk_mp.cli import exit_code
    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.config import FleetConfig
    from cuzk_mp.daemon.jobs import JobTable
    from cuzk_mp.errors import AuthError
    from cuzk_mp.exit_codes import EXIT_INPUT

    shared = tmp_path / "inputs"
    circuit = types.SimpleNamespace(priority=Priority.NORMAL)
    engine = types.SimpleNamespace(circuits=types.SimpleNamespace(check_job=lambda spec: None))
    jobs = JobTable(cast(Any, engine), cast(Any, None), cast(Any, {"x": circuit}), cast(Any, None), 60.0,
                    max_client_priority=Priority.NORMAL)
    cfg = FleetConfig(dsn=fleet_dsn, box="a", heartbeat_interval_s=0.5, inputs_dir=shared)
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": circuit})), engine, jobs)
    client = Identity(owner="client-1", admin=False)

    def wtns(tag: bytes, priority: str) -> P.SubmitProof:
        return P.SubmitProof(id=1, circuit_id="x", partitions=[P.PartitionIn("wtns", b"wtns" + tag * 100)],
                             request_id=tag.decode(), priority=priority)  # type: ignore[arg-type]

    async def main() -> None:
        from cuzk_mp.daemon.fleet.queue import Fleet
        box.fleet = await Fleet.from_config(cfg, heartbeats=False)
        try:
            with pytest.raises(AuthError, match=re.escape('at most NORMAL ([daemon] max_client_priority = "NORMAL")')
                               ) as refused:
                await box.submit(wtns(b"one", "CRITICAL"), client)
            assert exit_code(refused.value)[0] == EXIT_INPUT == 2
            assert not shared.exists() or list(shared.iterdir()) == []
            await box.submit(wtns(b"two", "NORMAL"), client)
            await box.submit(wtns(b"three", "CRITICAL"), Identity(owner="client-admin", admin=True))
        finally:
            await box.fleet.close()

    asyncio.run(main())
    assert query_one(fleet_dsn, "SELECT count(*) FROM cuzk_fleet_requests WHERE request_id = 'one'") == (0,)
    assert query_one(fleet_dsn, "SELECT string_agg(request_id || '=' || priority, ',' ORDER BY request_id) "
                                "FROM cuzk_fleet_jobs") == ("three=0,two=2",)
