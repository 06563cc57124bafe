"""The shared fleet queue under load, with a box SIGKILLed mid-run: jobs, boxes, lost, duplicated, re-claims.

Starts a throwaway PostgreSQL server (as the fleet tests do: temp directory, 127.0.0.1, a free port,
an unprivileged user when run as root) unless ``--dsn`` is given, then ``--boxes`` box processes
(each a FleetWorker whose job reads the inputs through their reference, checks the sha256 and
works ``--work-s`` seconds), submits ``--jobs`` jobs over two circuits from a client box (each
with a request_id, each submitted twice, to two boxes), SIGKILLs one box once a third of the
jobs started, and waits for every job. It reports submit latency, end-to-end throughput, how long
after a job's result commit its waiter woke (LISTEN/NOTIFY), and what the kill cost::

    .venv/bin/python perf/fleet_queue.py [--jobs 300] [--boxes 3] [--slots 2] [--work-s 0.05] \
        [--stall-s 3] [--json perf/results/fleet-queue-cpu.json]

Exit code 0 when no job was lost, no run finished twice (no result refused by the write-once
guard), and every re-claimed job was one the killed box had started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fleet"))

import pg_server  # noqa: E402
from fleet_helpers import BoxProcess, make_inputs  # noqa: E402

from cuzk_mp.daemon.fleet.queue import Fleet  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, in milliseconds, rounded."""
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)


@contextlib.contextmanager
def database(dsn: str | None, name: str = "fleet_perf") -> Iterator[str]:
    """The given database, or a fresh one on a throwaway server."""
    if dsn is not None:
        yield dsn
        return
    bins = pg_server.find_binaries()
    if bins is None:
        raise SystemExit("no PostgreSQL server programs found; pass --dsn")
    with pg_server.running_server(bins) as server, pg_server.fresh_database(server, name) as fresh:
        yield fresh


async def drive(args: argparse.Namespace, dsn: str, boxes: list[BoxProcess], tmp: Path) -> dict[str, Any]:
    """Submit, kill one box at a third, await everything; the measurements."""
    inputs = make_inputs(tmp, args.jobs)
    client = await Fleet.connect(dsn, "client", heartbeat_interval_s=0.5, stall_timeout_s=args.stall_s)
    other = await Fleet.connect(dsn, "client-2", heartbeat_interval_s=0.5, stall_timeout_s=args.stall_s)
    t0 = time.monotonic()
    submit_s, jobs = [], []
    woke: dict[str, float] = {}

    async def wait(job_id: str) -> None:
        await client.await_result(job_id, 600)
        woke[job_id] = time.time()

    waiting = []
    for i, inp in enumerate(inputs):
        t = time.monotonic()
        ref = await client.submit(f"perf-{i}", "xy"[i % 2], inp.ref, inp.sha256)
        submit_s.append(time.monotonic() - t)
        waiting.append(asyncio.create_task(wait(ref.job_id)))  # waiting before the job can finish
        dup = await other.submit(f"perf-{i}", "xy"[i % 2], inp.ref, inp.sha256)
        assert dup.job_id == ref.job_id and dup.duplicate
        jobs.append(ref.job_id)
    submitted = time.monotonic() - t0
    waiters = asyncio.gather(*waiting)
    victim = boxes[-1]
    while sum(len(b.named("started")) for b in boxes) < args.jobs // 3:
        await asyncio.sleep(0.02)
    held_at_kill = len(victim.named("started"))
    victim.kill()
    killed_at = time.monotonic()
    await waiters
    wall = time.monotonic() - t0
    statuses = [await client.status(j) for j in jobs]
    await client.close()
    await other.close()
    notify_s = [woke[s.job_id] - (s.finished_at or 0) for s in statuses]
    started = [(ev["job_id"], b.box) for b in boxes for ev in b.named("started")]
    on_victim = {j for j, box in started if box == victim.box}
    return {
        "jobs": args.jobs, "boxes": args.boxes, "slots_per_box": args.slots, "work_s": args.work_s,
        "stall_timeout_s": args.stall_s,
        "done": sum(s.state == "done" for s in statuses),
        "lost": sum(s.state != "done" for s in statuses),
        "results_from_box_that_ran_it": sum((s.box, s.job_id) in {(b, j) for j, b in started} for s in statuses),
        "runs_started": len(started),
        "jobs_started_on_two_boxes": len(started) - len({j for j, _ in started}),
        "reclaimed_after_kill": sum(s.claims > 1 for s in statuses),
        "reclaimed_jobs_were_on_killed_box": all(s.job_id in on_victim for s in statuses if s.claims > 1),
        "reclaimed": [{"job_id": s.job_id, "claims": s.claims, "started_on": [b for j, b in started if j == s.job_id],
                       "done_on": s.box} for s in statuses if s.claims > 1],
        "killed_box": victim.box, "killed_at_s": round(killed_at - t0, 3),
        "killed_box_had_started": held_at_kill,
        "wall_s": round(wall, 3), "jobs_per_s": round(args.jobs / wall, 2),
        "submit_phase_s": round(submitted, 3),
        "submit_ms": {"p50": pct(submit_s, 0.5), "p99": pct(submit_s, 0.99), "max": pct(submit_s, 1.0)},
        "result_to_waiter_ms": {"p50": pct(notify_s, 0.5), "p99": pct(notify_s, 0.99),
                                "mean": round(1000 * statistics.fmean(notify_s), 2)},
        "per_box_completed": {b.box: sum(s.box == b.box for s in statuses) for b in boxes},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=None, help="an empty database to use (default: start a server)")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--work-s", type=float, default=0.05)
    ap.add_argument("--stall-s", type=float, default=3.0)
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "fleet-queue-cpu.json")
    args = ap.parse_args()
    import tempfile
    with database(args.dsn) as dsn, tempfile.TemporaryDirectory(prefix="cuzk-fleet-perf-") as tmp:
        boxes = [BoxProcess(dsn, f"box{i}", ["x", "y"], slots=args.slots, work_s=args.work_s,
                            stall_s=args.stall_s) for i in range(args.boxes)]
        try:
            for b in boxes:
                b.wait_for("ready", 60)
            row = asyncio.run(drive(args, dsn, boxes, Path(tmp)))
        finally:
            for b in boxes:
                if b.proc.poll() is None:
                    b.stop()
    # A run that finished but lost the guarded result write would show up here: the survivors'
    # started runs that neither completed, failed nor were aborted.
    survivors = [b for b in boxes if b.box != row["killed_box"]]
    stopped = [b.named("stopped")[-1] for b in survivors]
    row["results_refused_by_guard"] = sum(len(b.named("started")) for b in survivors) - sum(
        ev["completed"] + ev["failed"] + ev["aborted"] for ev in stopped)
    result = {"what": "fleet queue: box processes claim and run jobs from one PostgreSQL; one box SIGKILLed "
                      "after a third of the jobs started",
              "command": " ".join(["python", *sys.argv]), **row, "machine": machine_info([])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    print(f"wrote {args.json}")
    ok = row["lost"] == 0 and row["results_refused_by_guard"] == 0 and row["reclaimed_jobs_were_on_killed_box"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
