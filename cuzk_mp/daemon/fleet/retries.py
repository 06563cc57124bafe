"""Where a failed job runs again: on a box it has not failed on, where one can take it.

This module owns the SQL of that preference; it keeps no state, and every decision is the
database's, by its ``now()``. A box that fails every job quickly (a GPU broken but not reported
dead, a corrupt key cache) has its slots free first, so it claimed its own retries again, and a
job spent all its attempts there and ended ``failed`` while healthy boxes holding its key were free.

* ``cuzk_fleet_jobs.failed_on`` lists the boxes a job failed on (:data:`FAILED_HERE`: a run that
  failed, or whose box stopped renewing its claim: :func:`fail_lapsed` counts that attempt, and
  ends the job ``failed`` where it was the last).
* A failed run goes back to the queue for ``retry_delay``, and a heartbeat interval longer where
  another box could take it (:func:`hold_s`: up, not paused, its key resident, not in
  ``failed_on``). Where none can (a fleet of one box, the only holder of the key) the box it failed
  on takes it again after ``retry_delay``, as before: no job waits for a box that does not exist.
* During that wait a box the job has not failed on may claim it at once (:func:`take_retries`, run
  by the claim before the queue library's dequeue, in its transaction): the ``requeued``
  notification wakes the other boxes as the failure commits. A box with no free slot does not
  claim, so the job goes back to the box it failed on once the wait is over if no other box freed
  a slot meanwhile: the preference never stops a job, and no box is paused or penalised for its
  failures (a client's bad inputs fail on every box).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

import psycopg
from pgqueuer.adapters.persistence.queries import Queries
from pgqueuer.domain import models as pgq
from pgqueuer.domain.types import JobId
from psycopg import sql

from cuzk_mp.daemon.fleet.config import FleetConfig
from cuzk_mp.daemon.fleet.store import notify
from cuzk_mp.daemon.protocol import encodable_text

log = logging.getLogger("cuzk_mp.daemon.fleet")

# The job row's own box (the one that ran it) added to the boxes it failed on, once.
FAILED_HERE = ("failed_on = CASE WHEN box IS NULL OR box = ANY(failed_on) THEN failed_on "
               "ELSE array_append(failed_on, box) END")


async def hold_s(conn: psycopg.AsyncConnection, cfg: FleetConfig, job_id: str) -> float:
    """How long the job, just failed on a box (already in its ``failed_on``), waits in the queue:
    ``retry_delay``, plus ``heartbeat_interval`` where another box could take it meanwhile (one that
    is up by its own stall timeout, unpaused, holds the job's key resident and has not failed it).
    A box of a release before ``failed_on`` counts too, though it does not claim the job before the
    wait is over: while a fleet is upgraded, such a retry comes a heartbeat interval later."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM cuzk_fleet_jobs j JOIN cuzk_fleet_boxes b ON j.circuit_id = ANY(b.resident) "
        "WHERE j.job_id = %s AND b.box <> ALL(j.failed_on) AND b.left_at IS NULL AND b.paused IS NULL "
        "AND b.last_heartbeat >= now() - make_interval(secs => b.stall_timeout_s))", (job_id,))
    row = await cur.fetchone()
    others = row is not None and bool(row[0])
    return cfg.retry_delay_s + (cfg.heartbeat_interval_s if others else 0.0)


async def take_retries(conn: psycopg.AsyncConnection, queue_table: sql.Identifier, box: str,
                       entrypoints: Sequence[str], n: int) -> list[tuple[int, datetime]]:
    """Make up to ``n`` waiting retries claimable by this transaction's dequeue: queued jobs of
    ``entrypoints`` whose wait (``execute_after``) is not over, that failed on other boxes and never
    on ``box``, best first as the dequeue orders them; their queue ids and the ``execute_after`` each
    had, for :func:`put_back`. Rows another transaction holds are left alone."""
    if n <= 0:
        return []
    # The dequeue takes rows whose execute_after is before its transaction's now(): this one's.
    cur = await conn.execute(sql.SQL(
        "WITH waiting AS (SELECT q.id, q.execute_after FROM {queue} q JOIN cuzk_fleet_jobs j ON j.queue_id = q.id "
        "WHERE q.entrypoint = ANY(%s) AND q.status = 'queued' AND q.execute_after >= now() AND j.state = 'queued' "
        "AND cardinality(j.failed_on) > 0 AND %s <> ALL(j.failed_on) ORDER BY q.priority DESC, q.id ASC "
        "LIMIT %s FOR UPDATE OF q SKIP LOCKED) "
        "UPDATE {queue} q SET execute_after = now() - interval '1 millisecond' FROM waiting WHERE q.id = waiting.id "
        "RETURNING q.id, waiting.execute_after").format(queue=queue_table), (list(entrypoints), box, n))
    return [(int(r[0]), r[1]) for r in await cur.fetchall()]


async def put_back(conn: psycopg.AsyncConnection, queue_table: sql.Identifier, taken: list[tuple[int, datetime]],
                   picked: set[int]) -> None:
    """Give the retries :func:`take_retries` made claimable and the dequeue did not pick (better
    jobs filled the batch, or their rows were locked) their wait back, in the same transaction: no
    other box, the one they failed on included, ever sees them claimable early."""
    back = [(qid, at) for qid, at in taken if qid not in picked]
    if back:
        await conn.execute(sql.SQL(
            "UPDATE {queue} q SET execute_after = b.at FROM unnest(%s::bigint[], %s::timestamptz[]) AS b(id, at) "
            "WHERE q.id = b.id AND q.status = 'queued'").format(queue=queue_table),
            ([qid for qid, _ in back], [at for _, at in back]))


async def fail_lapsed(conn: psycopg.AsyncConnection, queries: Queries, cfg: FleetConfig, instance: uuid.UUID,
                      picked: list[pgq.Job]) -> tuple[set[int], set[int]]:
    """In the claim's transaction: count an attempt for each picked job still ``running`` under
    another process's claim (the queue hands it out again because that claim lapsed: the run ended
    without a result; its box joins ``failed_on``), and end those whose attempts are used up
    ``failed``, settled in the queue; the queue ids of the lapsed claims and of the jobs so ended."""
    cur = await conn.execute(
        f"UPDATE cuzk_fleet_jobs SET attempts = attempts + 1, {FAILED_HERE} WHERE queue_id = ANY(%s) "
        "AND state = 'running' AND owner IS DISTINCT FROM %s RETURNING queue_id, job_id, attempts, box",
        ([int(j.id) for j in picked], instance))
    ended: set[int] = set()
    lapsed: set[int] = set()
    by_id = {int(j.id): j for j in picked}
    for queue_id, job_id, attempts, box in await cur.fetchall():
        lapsed.add(queue_id)
        if attempts < cfg.max_attempts:
            continue
        error = (f"box {box} stopped renewing its claim while it ran the job (killed, out of memory, or cut off "
                 f"from the database) and attempt {attempts} of max_attempts = {cfg.max_attempts} was "
                 "the last: not run again")
        await queries.log_jobs([(by_id[queue_id], "exception", traceback_record(queue_id, "WorkerDied", error))])
        await conn.execute("UPDATE cuzk_fleet_jobs SET state = 'failed', owner = NULL, error = %s, "
                           "error_kind = 'WorkerDied', finished_at = now() WHERE job_id = %s", (error, job_id))
        await notify(conn, {"event": "finished", "job_id": job_id})
        log.warning("fleet: job %s failed: %s", job_id, error)
        ended.add(queue_id)
    return lapsed, ended


def traceback_record(queue_id: int, kind: str, message: str) -> pgq.TracebackRecord:
    """The library's log record of a failed run (shown by its own tools)."""
    return pgq.TracebackRecord(job_id=JobId(queue_id), timestamp=pgq.utc_now(), exception_type=kind,
                               exception_message=message[:4000], traceback="", additional_context=None)


def stored_text(s: str) -> str:
    """``s`` as PostgreSQL's text and jsonb take it (an error may quote anything: a circuit's own
    message, a file name): lone surrogates and NUL, which they refuse, escaped."""
    return encodable_text(s).replace("\0", "\\x00")
