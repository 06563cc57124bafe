"""The ``cuzk-mp fleet`` verb: look at the shared queue from any machine that reaches its database.

``cuzk-mp fleet status --dsn DSN [--json]`` prints the boxes (state, host, running jobs, free
slots, heartbeat age, resident keys), the queue depths per circuit and priority, and the unfinished
jobs that failed on a box (the boxes, in order, and the last error). The DSN
comes from ``--dsn``, else from ``[fleet] dsn`` of a daemon's config file (``--config``), else
``$CUZK_MP_FLEET_DSN``. It connects as an observer: it is not listed as a box and claims nothing.
Exit codes: 0 shown; 2 bad arguments, or a dsn or role the database refuses (a wrong password, no such
role or database, permission denied); 3 the database could not be reached or did not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from cuzk_mp.errors import CuzkError, InputError, ResourceError
from cuzk_mp.exit_codes import EXIT_INPUT, EXIT_UNREACHABLE
from cuzk_mp.logs import final_error
from cuzk_mp.paths import FileArg

DSN_ENV = "CUZK_MP_FLEET_DSN"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``fleet`` verb to the ``cuzk-mp`` parser."""
    f = subparsers.add_parser("fleet", help="the shared PostgreSQL queue of several daemons")
    f_sub = f.add_subparsers(dest="fleet_verb", required=True)
    s = f_sub.add_parser("status", help="boxes, their resident keys, queue depths, retried jobs")
    s.add_argument("--dsn", default="", help=f"PostgreSQL DSN of the fleet (default: --config's, else ${DSN_ENV})")
    s.add_argument("--config", type=FileArg("config file"), help="a daemon config file whose [fleet] dsn to use")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--timeout", type=float, default=10.0, help="connect timeout in seconds")
    s.set_defaults(func=run_status)


async def _status(dsn: str, as_json: bool, timeout_s: float, knobs: dict[str, Any]) -> str:
    from cuzk_mp.daemon.fleet import report
    from cuzk_mp.daemon.fleet.queue import Fleet
    fleet = await Fleet.connect(dsn, "status", register=False, connect_timeout_s=timeout_s, **knobs)
    try:
        boxes = await fleet.boxes()
        depths = await fleet.queue_depths()
        retrying = await fleet.retrying()
    finally:
        await fleet.close()
    if as_json:
        return json.dumps(report.document(boxes, depths, retrying), indent=2) + "\n"
    return report.text(boxes, depths, retrying)


def _dsn(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The DSN to use (--dsn, else the config file's [fleet] dsn, else $CUZK_MP_FLEET_DSN) and,
    with --config, the fleet's own stall timeout (the least time after which a job's claim counts as
    stalled in the queue depths, and what makes a box stale where its row records no stall timeout of
    its own: a release before schema 4)."""
    knobs: dict[str, Any] = {}
    fleet = None
    if args.config is not None:
        from cuzk_mp.daemon.config import load_config
        fleet = load_config(args.config).fleet
        if fleet is None and not args.dsn:
            raise InputError(f"{args.config}: no [fleet] dsn: this daemon runs alone")
        if fleet is not None:
            knobs.update(stall_timeout_s=fleet.stall_timeout_s, heartbeat_interval_s=fleet.heartbeat_interval_s)
    if args.dsn:
        return str(args.dsn), knobs
    if fleet is not None:
        return fleet.dsn, knobs
    return os.environ.get(DSN_ENV, ""), knobs


def _error(code: int, message: str) -> int:
    """The one line ``fleet status`` ends with when it fails (a database's multi-line message folded)."""
    return final_error(code, message, prefix="cuzk-mp fleet status", logger=__name__)


def run_status(args: argparse.Namespace) -> int:
    """``cuzk-mp fleet status``: print the fleet and return the exit code."""
    try:
        dsn, knobs = _dsn(args)
        if not dsn:
            return _error(EXIT_INPUT, f"give --dsn or --config, or set ${DSN_ENV}")
        sys.stdout.write(asyncio.run(_status(dsn, args.json, args.timeout, knobs)))
    except ResourceError as e:
        return _error(EXIT_UNREACHABLE, str(e))
    except (InputError, CuzkError) as e:
        return _error(EXIT_INPUT, str(e))
    return 0
