"""Three real daemons sharing one PostgreSQL queue, one of them SIGKILLed mid-run: jobs, lost, duplicated.

Starts a throwaway PostgreSQL server (as the fleet tests do) unless ``--dsn`` is given, and three
``cuzk-mp daemon`` processes as boxes of one fleet (CPU backend, porep-like circuits x and y at
2^10 rows, both keys preloaded on every box, ``--slots`` jobs at once per box). It submits
``--jobs`` jobs of ``--partitions`` synthetic partitions each, alternating circuits, each with a
request_id sent to two different daemons (the second submit must return the same job), awaits
every job at a surviving daemon, and SIGKILLs one daemon once a third of the jobs started and it
runs at least one. It verifies every proof (cuzk-mp's verifier, public signals against the
generator's witness) and reports::

    jobs, boxes, done, lost (not done), duplicated (jobs proved to completion more than once: the
    survivors' engine counters plus what the killed box wrote, minus the jobs), re-claims after the
    kill (jobs claimed twice; each one the killed box held) and how long after the kill each was
    re-claimed, submit and await latency, proofs per second

    .venv/bin/python perf/fleet_e2e.py [--jobs 60] [--partitions 2] [--slots 2] [--stall-s 5] \\
        [--json perf/results/fleet-e2e-cpu.json]

Exit code 0 when every job is done and verified, none was proved twice, and every re-claimed job
was one the killed box held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fleet"))

from fleet_daemons import TOKEN, BoxSpec, DaemonFleet, Timing  # noqa: E402
from fleet_queue import database, pct  # noqa: E402

from cuzk_mp.daemon import protocol as P  # noqa: E402
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions  # noqa: E402
from cuzk_mp.formats.snarkjs_json import public_from_json  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402
from tests.helpers import ProofChecker, synthetic_key  # noqa: E402

BOXES = ("a", "b", "c")
VICTIM = "c"


async def drive(args: argparse.Namespace, fleet: DaemonFleet) -> dict[str, Any]:
    """Submit (twice each), kill one box at a third, await everything; the raw measurements."""
    clients = {b: await AsyncClient.connect(fleet.daemons[b].addr, token=TOKEN) for b in BOXES}
    done_before = {b: fleet.engine_jobs(b) for b in BOXES}
    t0 = time.monotonic()
    submit_s: list[float] = []
    seeds: dict[str, list[int]] = {}
    replies: dict[str, P.JobReply] = {}
    woke: dict[str, float] = {}
    survivors = [b for b in BOXES if b != VICTIM]

    async def wait(job_id: str, box: str) -> None:
        replies[job_id] = await clients[box].await_proof(job_id, timeout_s=args.timeout_s)
        woke[job_id] = time.time()

    waiting = []
    for i in range(args.jobs):
        parts = synthetic_partitions(args.partitions, first_seed=i * args.partitions)
        first, second = BOXES[i % 3], BOXES[(i + 1) % 3]
        t = time.monotonic()
        sub = await clients[first].submit("xy"[i % 2], parts, request_id=f"e2e-{i}")
        submit_s.append(time.monotonic() - t)
        dup = await clients[second].submit("xy"[i % 2], parts, request_id=f"e2e-{i}")
        assert dup.job_id == sub.job_id and dup.duplicate, (sub, dup)
        seeds[sub.job_id] = [p.seed for p in parts]
        waiting.append(asyncio.create_task(wait(sub.job_id, survivors[i % 2])))
    submitted = time.monotonic() - t0
    jobs = list(seeds)

    def started_and_held() -> tuple[int, list[str]]:
        [(started,)] = fleet.rows("SELECT count(*) FROM cuzk_fleet_jobs WHERE started_at IS NOT NULL")
        held = [r[0] for r in fleet.rows("SELECT job_id FROM cuzk_fleet_jobs WHERE state = 'running' "
                                         "AND box = %s", VICTIM)]
        return int(started), held

    while True:
        started, held = await asyncio.to_thread(started_and_held)
        if started >= args.jobs // 3 and held:
            break
        if all(w.done() for w in waiting):  # every job ended before the victim held one: nothing to kill
            raise SystemExit("fleet_e2e: every job finished before the box to kill held one; "
                             "ask for more jobs or partitions (--jobs, --partitions)")
        await asyncio.sleep(0.02)
    t_kill = time.monotonic()
    await asyncio.to_thread(fleet.sigkill, VICTIM)
    killed_at = t_kill - t0
    _, held = await asyncio.to_thread(started_and_held)  # its claims, as it left them (none can lapse yet)

    reclaimed_at: dict[str, float] = {}

    async def watch_reclaims() -> None:
        while len(reclaimed_at) < len(held):
            for (job_id,) in await asyncio.to_thread(
                    fleet.rows, "SELECT job_id FROM cuzk_fleet_jobs WHERE claims > 1 AND job_id = ANY(%s)", held):
                reclaimed_at.setdefault(job_id, time.monotonic() - t_kill)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_reclaims())
    await asyncio.gather(*waiting)
    wall = time.monotonic() - t0
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    for c in clients.values():
        with contextlib.suppress(Exception):
            await c.close()

    rows = {r[0]: r[1:] for r in fleet.rows(
        "SELECT job_id, state, box, claims, extract(epoch FROM finished_at) FROM cuzk_fleet_jobs "
        "WHERE job_id = ANY(%s)", jobs)}
    done_after = {b: fleet.engine_jobs(b) for b in survivors}
    written_by_victim = sum(1 for state, box, _, _ in rows.values() if state == "done" and box == VICTIM)
    completed_runs = sum(done_after[b] - done_before[b] for b in survivors) + written_by_victim
    reclaimed = [j for j, (_, _, claims, _) in rows.items() if claims > 1]
    finished = {j: float(r[3]) for j, r in rows.items() if r[3] is not None}
    return {
        "jobs": args.jobs, "boxes": len(BOXES), "partitions_per_job": args.partitions,
        "slots_per_box": args.slots, "heartbeat_s": args.heartbeat_s, "stall_timeout_s": args.stall_s,
        "done": sum(r.state == "done" for r in replies.values()),
        "lost": sum(rows[j][0] != "done" for j in jobs),
        "duplicated": int(completed_runs - sum(rows[j][0] == "done" for j in jobs)),
        "results_written_by_killed_box": written_by_victim,
        "killed_box": VICTIM, "killed_at_s": round(killed_at, 3), "killed_box_held": len(held),
        "reclaimed_after_kill": len(reclaimed),
        "reclaimed_jobs_were_held_by_killed_box": set(reclaimed) <= set(held),
        "reclaimed_s_after_kill": sorted(round(v, 2) for v in reclaimed_at.values()),
        "per_box_completed": {b: sum(1 for _, box, _, _ in rows.values() if box == b) for b in BOXES},
        "wall_s": round(wall, 3), "proofs_per_s": round(args.jobs * args.partitions / wall, 2),
        "submit_phase_s": round(submitted, 3),
        "submit_ms": {"p50": pct(submit_s, 0.5), "p99": pct(submit_s, 0.99), "max": pct(submit_s, 1.0)},
        "result_to_waiter_ms": pct([woke[j] - finished[j] for j in jobs if j in finished], 0.5),
        "_replies": replies, "_seeds": seeds,
    }


def verify_all(checker: ProofChecker, replies: dict[str, P.JobReply], seeds: dict[str, list[int]]) -> int:
    """Partitions that verify and carry the generator's public signals for their seed."""
    ok = 0
    for job_id, r in replies.items():
        for p, seed in zip(r.partitions, seeds[job_id], strict=True):
            public = public_from_json(p.public) if p.state == "done" else []
            ok += bool(public == checker.expected_public(seed, p.index) and checker.verifies(public, p.proof))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=None, help="an empty database to use (default: start a server)")
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--heartbeat-s", type=float, default=0.5)
    ap.add_argument("--stall-s", type=float, default=5.0)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "fleet-e2e-cpu.json")
    args = ap.parse_args()
    zkey, _ = synthetic_key()
    checker = ProofChecker(zkey)
    specs = [BoxSpec(b, ("x", "y"), ("x", "y"), max_jobs=args.slots) for b in BOXES]
    with database(args.dsn, "fleet_e2e") as dsn, tempfile.TemporaryDirectory(prefix="cuzk-fleet-e2e-") as tmp:
        fleet = DaemonFleet(dsn, specs, Path(tmp), cache=zkey.parent,
                            timing=Timing(heartbeat_s=args.heartbeat_s, stall_s=args.stall_s))
        try:
            t = time.monotonic()
            fleet.start()
            print(f"three daemons serving after {time.monotonic() - t:.1f} s", file=sys.stderr)
            row = asyncio.run(drive(args, fleet))
        finally:
            codes = fleet.stop()
    replies, seeds = row.pop("_replies"), row.pop("_seeds")
    row["partitions_verified"] = verify_all(checker, replies, seeds)
    row["survivors_exit_codes"] = codes
    result = {"what": "fleet end to end: three cuzk-mp daemons (CPU backend) share one PostgreSQL queue; each "
                      "job submitted to two daemons with one request_id; one daemon SIGKILLed mid-run",
              "command": " ".join(["python", *sys.argv]), **row, "machine": machine_info([])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    print(f"wrote {args.json}")
    ok = (row["lost"] == 0 and row["duplicated"] == 0 and row["reclaimed_jobs_were_held_by_killed_box"]
          and row["partitions_verified"] == args.jobs * args.partitions and all(c == 0 for c in codes.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
