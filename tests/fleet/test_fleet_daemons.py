"""Three real daemons sharing one queue: the fleet wired into ``cuzk-mp daemon``, end to end.

A real PostgreSQL server (the ``pg`` fixture) and three ``cuzk-mp daemon`` processes (CPU backend,
porep-like circuits at 2^10 rows, one prover process each) with different circuits and resident
keys, and the same client tokens:

=====  ==========  ===========  ========  =============================================
box    circuits    preloaded    max_jobs  role in the tests
=====  ==========  ===========  ========  =============================================
a      x, y, z     x, y         2         z configured but not resident: loads it for a backlog
b      x, p        x, p         1         the only box with p: priorities on a one-slot box
c      y, z        y            0 (= 1)   z configured but not resident
=====  ==========  ===========  ========  =============================================

The tests run in file order on these three daemons; the last one SIGKILLs the box running a job.
Every proof is checked with cuzk-mp's verifier (a changed public input must fail), its public
signals against the generator's witness, and with snarkjs when the node tools are installed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_daemons import OTHER_TOKEN, TOKEN, BoxSpec, DaemonFleet, Timing

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.errors import InputError
from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json
from cuzk_mp.groth16.verifier import verify
from tests.helpers import ENV, PY, ProofChecker, parse_prometheus, snarkjs_verify

TIMING = Timing(heartbeat_s=0.5, stall_s=5.0)
SPECS = [BoxSpec("a", ("x", "y", "z"), ("x", "y"), max_jobs=2), BoxSpec("b", ("x", "p"), ("x", "p"), max_jobs=1),
         BoxSpec("c", ("y", "z"), ("y",))]
CIRCUITS = {s.name: s.circuits for s in SPECS}
BOXES = list(CIRCUITS)


class Fleet3(DaemonFleet):
    """The three daemons, and the checks of their proofs."""

    checker: ProofChecker
    vk: dict[str, Any]

    def check(self, replies: list[P.JobReply], seeds: dict[str, list[int]]) -> None:
        """Every partition of every reply verifies, has the generator's public signals for its
        seed, and fails with a changed public input; snarkjs agrees on all of them."""
        cases = []
        for r in replies:
            assert r.state == "done" and not r.timed_out, r
            assert len(r.partitions) == len(seeds[r.job_id])
            for p, seed in zip(r.partitions, seeds[r.job_id], strict=True):
                public = public_from_json(p.public)
                assert public == self.checker.expected_public(seed, p.index), (r.job_id, p.index)
                assert self.checker.verifies(public, p.proof), (r.job_id, p.index)
                wrong = [(public[0] + 1) % 2**250, *public[1:]]
                assert not verify(self.checker.pvk, wrong, proof_from_json(p.proof))
                cases.append((p.public, p.proof))
        snarkjs_verify(self.vk, cases)


@pytest.fixture(scope="module")
def fleet3(module_fleet_dsn: str, checker: ProofChecker, test_key: tuple[Path, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet3]:
    fleet = Fleet3(module_fleet_dsn, SPECS, tmp_path_factory.mktemp("fleet"), cache=test_key[0].parent,
                   timing=TIMING)
    fleet.checker = checker
    try:
        fleet.start()
        with fleet.client("a") as c:
            fleet.vk = c.verification_key("x")  # every circuit here has the same (synthetic) key
        yield fleet
    finally:
        codes = fleet.stop()
    assert all(code == 0 for code in codes.values()), codes


def _submit_all(fleet: Fleet3, plan: list[tuple[str, str, list[int]]]) -> dict[str, list[int]]:
    """Submit (box, circuit, seeds) jobs; {job_id: seeds}."""
    seeds: dict[str, list[int]] = {}
    for box, circuit, job_seeds in plan:
        with fleet.client(box) as c:
            parts = [P.PartitionIn(kind="synthetic", seed=s) for s in job_seeds]
            sub = c.submit(circuit, parts)
        assert sub.state == "queued" and not sub.duplicate
        seeds[sub.job_id] = job_seeds
    return seeds


def test_every_job_is_proved_once_by_a_box_holding_its_key(fleet3: Fleet3) -> None:
    before = {box: fleet3.engine_jobs(box) for box in BOXES}
    # x: boxes a and b hold it; y: a and c; z: nobody holds it at first, a and c may load it.
    plan = [("ab"[i % 2], "x", [100 + i]) for i in range(6)]
    plan += [("ac"[i % 2], "y", [200 + i, 300 + i]) for i in range(6)]
    plan += [("ca"[i % 2], "z", [400 + i]) for i in range(4)]
    seeds = _submit_all(fleet3, plan)

    async def await_everywhere() -> list[P.JobReply]:  # each job awaited at a box chosen round-robin
        clients = [await AsyncClient.connect(fleet3.daemons[b].addr, token=TOKEN) for b in BOXES]
        try:
            return list(await asyncio.gather(*[clients[i % 3].await_proof(j, timeout_s=240)
                                               for i, j in enumerate(seeds)]))
        finally:
            for c in clients:
                await c.close()

    replies = asyncio.run(await_everywhere())
    assert {r.job_id for r in replies} == set(seeds)
    fleet3.check(replies, seeds)
    ran = {job: (circuit, box, claims) for job, circuit, box, claims in fleet3.rows(
        "SELECT job_id, circuit_id, box, claims FROM cuzk_fleet_jobs WHERE job_id = ANY(%s)", list(seeds))}
    assert all(claims == 1 for _, _, claims in ran.values()), ran
    with fleet3.client("c") as c:
        fleet = c.status()["fleet"]
    resident = {b["box"]: set(b["resident"]) for b in fleet["boxes"]}
    assert {b["box"]: b["state"] for b in fleet["boxes"]} == {"a": "up", "b": "up", "c": "up"}
    # Affinity: a box proves only circuits whose key it holds, listed in its row from its claim on; nothing
    # evicts a key here (every key fits the key budget, no EvictSRS), so the rows read now still list them.
    for circuit, box, _ in ran.values():
        assert circuit in CIRCUITS[box] and circuit in resident[box], (circuit, box, resident)
    assert "z" in resident["a"] | resident["c"], resident  # a key was loaded for the backlog
    by_box = {box: sum(1 for _, b, _ in ran.values() if b == box) for box in BOXES}
    assert by_box["b"] > 0 and by_box["c"] > 0 and by_box["a"] > 0, by_box
    after = {box: fleet3.engine_jobs(box) for box in BOXES}
    assert {box: after[box] - before[box] for box in BOXES} == by_box  # each proved once, nothing twice


def test_fleet_status_and_metrics_show_the_boxes_keys_and_queues(fleet3: Fleet3) -> None:
    cli = subprocess.run([*PY, "fleet", "status", "--config", str(fleet3.daemons["b"].config), "--json"],
                         env=ENV, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    boxes = {b["box"]: b for b in doc["boxes"]}
    assert set(boxes) == set(BOXES) and all(b["state"] == "up" for b in boxes.values())
    assert {"x", "p"} <= set(boxes["b"]["resident"]) and "p" not in boxes["a"]["resident"]
    with fleet3.client("a") as c:
        samples = parse_prometheus(c.metrics())
        status = c.status()
    assert samples[("cuzk_fleet_database_up", ())] == 1.0
    assert samples[("cuzk_fleet_boxes", (("state", "up"),))] == 3.0
    assert samples[("cuzk_fleet_box_resident_key", (("box", "b"), ("circuit", "p")))] == 1.0
    assert ("cuzk_fleet_box_resident_key", (("box", "c"), ("circuit", "p"))) not in samples
    assert status["fleet"]["box"] == "a" and status["fleet"]["capacity"] == 2
    assert all(b["pid"] is None for b in status["fleet"]["boxes"])  # pids only with detail (admin)


def test_one_request_id_sent_to_two_daemons_is_one_job(fleet3: Fleet3) -> None:
    parts = synthetic_partitions(2, first_seed=500)
    subs: list[P.Submitted] = []

    def submit(box: str) -> None:
        with fleet3.client(box) as c:
            subs.append(c.submit("y", parts, request_id="fleet-req-1"))

    threads = [threading.Thread(target=submit, args=(box,)) for box in "acac"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(subs) == 4 and len({s.job_id for s in subs}) == 1
    assert sum(not s.duplicate for s in subs) == 1
    job_id = subs[0].job_id
    with fleet3.client("b") as c:  # b does not prove y; it answers for any job of the fleet
        r = c.await_proof("fleet-req-1", timeout_s=120)  # a request_id names its job, as on one daemon
    assert r.job_id == job_id
    fleet3.check([r], {job_id: [500, 501]})
    with fleet3.client("c") as c:
        again = c.submit("y", parts, request_id="fleet-req-1")
        assert (again.job_id, again.state, again.duplicate) == (job_id, "done", True)
        with pytest.raises(InputError, match="already names job"):
            c.submit("y", synthetic_partitions(1), request_id="fleet-req-1")
    # The owner travels with the job: another client sees no such job at any box, and may not reuse the id.
    for box in BOXES:
        with fleet3.client(box, OTHER_TOKEN) as c, pytest.raises(InputError, match="unknown job"):
            c.await_proof(job_id, timeout_s=0)
    with fleet3.client("a", OTHER_TOKEN) as c, pytest.raises(InputError, match="already in use"):
        c.submit("y", parts, request_id="fleet-req-1")
    assert fleet3.rows("SELECT count(*), sum(claims) FROM cuzk_fleet_jobs WHERE request_id = 'fleet-req-1'") == [(1, 1)]


def test_priorities_on_a_one_slot_box(fleet3: Fleet3) -> None:
    with fleet3.client("b") as c:
        blocker = c.submit("p", synthetic_partitions(24, first_seed=600)).job_id
        assert fleet3.wait_running(blocker) == "b"
        order = ["LOW", "NORMAL", "HIGH", "CRITICAL"]
        ids = {c.submit("p", synthetic_partitions(1, first_seed=700 + i), priority=prio).job_id: prio
               for i, prio in enumerate(order)}
        assert c.await_proof(blocker, timeout_s=0).state == "running"  # all four queued behind it
        assert c.cancel(blocker).cancelled
        replies = [c.await_proof(j, timeout_s=120) for j in ids]
    fleet3.check(replies, {j: [700 + order.index(p)] for j, p in ids.items()})
    started = fleet3.rows("SELECT job_id, box FROM cuzk_fleet_jobs WHERE job_id = ANY(%s) ORDER BY started_at",
                          list(ids))
    assert [ids[j] for j, _ in started] == ["CRITICAL", "HIGH", "NORMAL", "LOW"]
    assert {box for _, box in started} == {"b"}


def test_a_cancel_sent_to_one_daemon_stops_a_job_running_on_another(fleet3: Fleet3) -> None:
    cancelled_before = fleet3.engine_jobs("b", "cancelled")
    with fleet3.client("b") as c:
        job = c.submit("p", synthetic_partitions(24, first_seed=800)).job_id
    assert fleet3.wait_running(job) == "b"
    with fleet3.client("a") as c:  # a does not even know circuit p
        reply = c.cancel(job)
    assert (reply.job_id, reply.cancelled, reply.state) == (job, True, "cancelled")
    t0 = time.monotonic()
    while fleet3.engine_jobs("b", "cancelled") == cancelled_before:  # b's engine stopped the job
        assert time.monotonic() - t0 < 10, "box b's engine did not stop the cancelled job"
        time.sleep(0.1)
    with fleet3.client("c") as c:
        r = c.await_proof(job, timeout_s=5)
        assert r.state == "cancelled" and r.error_kind == "Cancelled"
        assert not c.cancel(job).cancelled  # already ended
    with fleet3.client("b") as c:  # b's slot is free again: its next job runs
        r = c.prove("p", synthetic_partitions(1, first_seed=900), timeout_s=120)
    fleet3.check([r], {r.job_id: [900]})


def test_sigkill_of_a_daemon_mid_job_its_job_completes_elsewhere_once(fleet3: Fleet3) -> None:
    with fleet3.client("a") as c:
        # enough partitions that the box is still at it after the half second below (~16 proofs/s on 2
        # cores: about 4 s), and the survivor proves them all again
        job = c.submit("x", synthetic_partitions(60, first_seed=1000)).job_id
    victim = fleet3.wait_running(job)
    survivor = "b" if victim == "a" else "a"
    done_before = fleet3.engine_jobs(survivor)
    time.sleep(TIMING.heartbeat_s)  # a renewal of the claim; partitions are being proved
    assert fleet3.rows("SELECT state FROM cuzk_fleet_jobs WHERE job_id = %s", job) == [("running",)]
    t_kill = time.monotonic()
    fleet3.sigkill(victim)  # and reaps what a restart would: its workers, its shm objects
    while fleet3.rows("SELECT claims FROM cuzk_fleet_jobs WHERE job_id = %s", job) == [(1,)]:
        assert time.monotonic() - t_kill < TIMING.stall_s + 30
        time.sleep(0.05)
    reclaimed_after = time.monotonic() - t_kill
    # not before the stall timeout (counted from the last renewal, at most one heartbeat before the kill)
    assert reclaimed_after >= TIMING.stall_s - TIMING.heartbeat_s - 0.2, reclaimed_after
    with fleet3.client(survivor) as c:
        r = c.await_proof(job, timeout_s=180)
    fleet3.check([r], {job: list(range(1000, 1060))})
    assert fleet3.rows("SELECT state, box, claims FROM cuzk_fleet_jobs WHERE job_id = %s", job) == [
        ("done", survivor, 2)]
    assert fleet3.engine_jobs(survivor) - done_before == 1
    boxes = {row[0]: row[1] for row in fleet3.rows("SELECT box, extract(epoch FROM now() - last_heartbeat) "
                                                   "FROM cuzk_fleet_boxes")}
    assert boxes[victim] > TIMING.stall_s  # the killed box is stale

