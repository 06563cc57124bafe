"""One fleet box as its own process, for the tests that need real processes (SIGKILL, concurrency).

``python box_process.py --dsn DSN --box NAME --circuits a,b [--slots N] [--work-s S] ...`` joins
the fleet and runs a :class:`FleetWorker` whose job reads the inputs through their reference,
checks their sha256, works for ``--work-s`` seconds (cancellable) and returns a small JSON result
naming the box and the digest it computed; with ``--hold claim`` it claims one job and stops inside
a transaction holding its rows (:func:`hold`), with ``--hold migration`` it stops inside its join's
migration (:func:`stop_in_migration`). It prints one JSON line per event on stdout
(``ready``, ``started``, ``aborted``, ``stopped``) so the test can follow it, logs on stderr,
and exits 0 on SIGTERM. It imports cuzk_mp from PYTHONPATH (set by the helper that starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import signal
import sys
import time

from cuzk_mp.daemon.fleet.inputs import load_inputs
from cuzk_mp.daemon.fleet.models import Claimed, JobOutput
from cuzk_mp.daemon.fleet.queue import Fleet
from cuzk_mp.daemon.fleet.worker import FleetWorker


def emit(event: str, **fields: object) -> None:
    """One JSON line on stdout, flushed at once (the test reads it while the box runs)."""
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


async def main(args: argparse.Namespace) -> int:
    """Run the box until SIGTERM."""
    circuits = args.circuits.split(",")

    async def run_job(c: Claimed) -> JobOutput:
        emit("started", job_id=c.job_id, circuit=c.circuit_id, claims=c.claims)
        data = load_inputs(c.inputs_ref, c.inputs_sha256)
        await asyncio.sleep(args.work_s)
        return JobOutput(json.dumps({"box": args.box, "digest": hashlib.sha256(data).hexdigest(),
                                     "circuit": c.circuit_id}).encode())

    def on_abort(job_id: str, reason: str) -> None:
        emit("aborted", job_id=job_id, reason=reason)

    if args.hold == "migration":
        stop_in_migration()
    fleet = await Fleet.connect(args.dsn, args.box, on_abort=on_abort, heartbeat_interval_s=args.heartbeat,
                                stall_timeout_s=args.stall, connect_timeout_s=args.connect_timeout,
                                heartbeats=args.hold is None)
    if args.hold == "claim":
        return await hold(fleet, circuits)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker = FleetWorker(fleet, run_job, resident=lambda: circuits, capacity=lambda: args.slots,
                         poll_s=args.poll)
    emit("ready", box=args.box)
    try:
        await worker.run(stop)
    finally:
        await fleet.close()
    emit("stopped", completed=worker.completed, failed=worker.failed, aborted=worker.aborted)
    return 0


def stop_in_migration() -> None:
    """Make the join stop inside the schema's migration, holding its lock, as a box does that is frozen
    there: ``migrating`` is printed at the first statement under the lock, and the join waits there."""
    from pgqueuer.adapters.persistence.queries import Queries

    async def stopped(self: Queries) -> bool:
        emit("migrating")
        await asyncio.Event().wait()
        return True

    Queries.schema_is_installed = stopped  # type: ignore[method-assign]


async def hold(fleet: Fleet, circuits: list[str]) -> int:
    """Claim one job, then stop inside a transaction that holds its rows locked, as a box does that is
    frozen (SIGSTOP, a debugger) or cut off between two statements of a claim or a settle: ``holding``
    is printed inside it, and the process waits there until killed."""
    while not (claimed := await fleet.claim(circuits, 1)):
        await asyncio.sleep(0.1)
    job_id = claimed[0].job_id
    async with fleet._tx() as (conn, _):
        await fleet._lock_queue_row(conn, job_id)
        await conn.execute("SELECT 1 FROM cuzk_fleet_jobs WHERE job_id = %s FOR UPDATE", (job_id,))
        emit("holding", job_id=job_id)
        await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--box", required=True)
    p.add_argument("--circuits", required=True)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--work-s", type=float, default=0.0)
    p.add_argument("--heartbeat", type=float, default=0.5)
    p.add_argument("--stall", type=float, default=2.0)
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--hold", choices=("claim", "migration"),
                   help="stop inside a claimed job's transaction (hold) or the join's migration (stop_in_migration)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(p.parse_args())))
