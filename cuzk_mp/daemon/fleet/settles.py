"""Settling a job a box holds: its result, its failure, its release, and a cancel from any box.

Why a module of its own: these are the writes that end a run, each one transaction guarded as
:mod:`.queue`'s docstring says (the first valid result wins; a failure or a release acts only while
this process holds the claim; the queue row is locked before the job row). :class:`~.queue.Fleet`,
which claims and renews, is a :class:`FleetSettles`; the claims it holds live here
(:class:`Held`), since every settle drops one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

import psycopg
from pgqueuer.adapters.persistence.queries import Queries
from pgqueuer.domain import models as pgq
from pgqueuer.domain.types import JOB_STATUS, JobId
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from cuzk_mp.daemon.fleet import retries, schema
from cuzk_mp.daemon.fleet.config import FleetConfig
from cuzk_mp.daemon.fleet.models import Claimed, Failed, JobState
from cuzk_mp.daemon.fleet.store import notify
from cuzk_mp.daemon.fleet.submits import FleetSubmits
from cuzk_mp.errors import InputError, ResourceError

log = logging.getLogger("cuzk_mp.daemon.fleet")


@dataclass
class Held:
    """A claim this process holds: what the daemon runs, and the library's row to settle."""

    claimed: Claimed
    queue_job: pgq.Job


class FleetSettles(FleetSubmits):
    """The settling part of a box's :class:`~.queue.Fleet` (see the module docstring)."""

    def __init__(self, cfg: FleetConfig, pool: AsyncConnectionPool) -> None:
        super().__init__(cfg, pool)
        self._held: dict[str, Held] = {}
        self._by_queue_id: dict[int, str] = {}
        # The claims of jobs whose last settle went unanswered (the call failed: its commit may have
        # happened), until a try is answered or the claim is let go (forget); an abort does not end it.
        self._unanswered: dict[str, Claimed] = {}

    async def complete(self, job_id: str, result: bytes, key_digest: str | None = None) -> bool:
        """Write the job's result (and the ``key_digest`` its proofs name, :class:`.models.JobOutput`),
        once: False (and nothing written) if it already ended.

        True also where this very write was tried before and committed, but its call failed (the
        connection dropped after the commit, :meth:`_unanswered_try`): the job's row shows this claim's
        result, and the try that wrote it is counted as this one, once."""
        if len(result) > schema.MAX_RESULT_BYTES:
            raise InputError(f"result: {len(result)} bytes, more than {schema.MAX_RESULT_BYTES}; results "
                             "live in the database and must stay small")
        async with self._unanswered_try(job_id), self._tx() as (conn, queries):
            await self._lock_queue_row(conn, job_id)
            cur = await conn.execute(
                "UPDATE cuzk_fleet_jobs SET state = 'done', result = %s, key_digest = %s, finished_at = now(), "
                "box = %s, error = NULL, error_kind = NULL WHERE job_id = %s AND state IN ('queued', 'running') "
                "RETURNING queue_id", (result, key_digest, self.box, job_id))
            row = await cur.fetchone()
            if row is not None:
                await self._settle(queries, job_id, row[0], "successful")
                await notify(conn, {"event": "finished", "job_id": job_id})
            elif mine := job_id in self._unanswered:  # ended before: by another box, or by this very write
                cur = await conn.execute("SELECT 1 FROM cuzk_fleet_jobs WHERE job_id = %s AND state = 'done' AND "
                                         "owner = %s AND box = %s AND result = %s",
                                         (job_id, self.instance, self.box, result))
                mine = await cur.fetchone() is not None
        self._drop(job_id)
        if row is None and mine:
            log.info("fleet: job %s done on box %s (by its earlier try, whose commit went unanswered)", job_id,
                     self.box)
            return True
        if row is None:
            log.info("fleet: result of job %s from box %s discarded: the job had already ended", job_id, self.box)
            return False
        log.info("fleet: job %s done on box %s", job_id, self.box)
        return True

    async def fail(self, job_id: str, error: str, *, error_kind: str = "ProofError", retry: bool = True) -> Failed:
        """Record a failed run: back to the queue while attempts remain and ``retry``, else failed; the
        job's state after it, and whether this box recorded it (:class:`.models.Failed`).

        This box joins the job's ``failed_on``; the retry waits ``retry_delay``, and a heartbeat
        interval longer where another box could take it meanwhile (:mod:`.retries`).

        Acts only while this process holds the claim; otherwise returns the job's state unchanged, not
        recorded here, except where this very failure was tried before and committed, but its call failed
        (the connection dropped after the commit, :meth:`_unanswered_try`): then the state that try
        recorded, as if this call had recorded it (see :meth:`_failed_by_this_claim`).
        ``error`` is stored as PostgreSQL takes text (:func:`.retries.stored_text`): a failure the database
        refused would never be recorded, and the job would stay running under this box for ever.
        """
        error = retries.stored_text(error)
        async with self._unanswered_try(job_id), self._tx() as (conn, queries):
            await self._lock_queue_row(conn, job_id)
            cur = await conn.execute("SELECT state, owner, attempts, queue_id, circuit_id FROM cuzk_fleet_jobs "
                                     "WHERE job_id = %s FOR UPDATE", (job_id,))
            row = await cur.fetchone()
            if row is None:
                raise InputError(f"job_id: unknown job {job_id!r}")
            state, owner, attempts, queue_id, circuit_id = row
            if state != "running" or owner != self.instance:
                recorded = await self._failed_by_this_claim(conn, job_id, error, error_kind)
                self._drop(job_id)
                if recorded is not None:
                    log.info("fleet: job %s failed on box %s (%s): %s -> %s (recorded by its earlier try, whose "
                             "commit went unanswered)", job_id, self.box, error_kind, error[:200], recorded)
                    return Failed(recorded, recorded=True)
                return Failed(cast(JobState, state), recorded=False)
            attempts += 1
            queue_job = await self._queue_job(queries, job_id, queue_id)
            if retry and attempts < self.cfg.max_attempts and queue_job is not None:
                new_state: JobState = "queued"
                await conn.execute("UPDATE cuzk_fleet_jobs SET state = 'queued', owner = NULL, attempts = %s, "
                                   f"error = %s, error_kind = %s, {retries.FAILED_HERE} WHERE job_id = %s",
                                   (attempts, error, error_kind, job_id))
                await queries.retry_job(queue_job, timedelta(seconds=await retries.hold_s(conn, self.cfg, job_id)),
                                        retries.traceback_record(queue_job.id, error_kind, error))
                await notify(conn, {"event": "requeued", "circuit_id": circuit_id})
            else:
                if queue_job is not None:
                    record = retries.traceback_record(queue_job.id, error_kind, error)
                    await queries.log_jobs([(queue_job, "exception", record)])
                new_state = "failed"
                await conn.execute("UPDATE cuzk_fleet_jobs SET state = 'failed', owner = NULL, attempts = %s, "
                                   f"error = %s, error_kind = %s, finished_at = now(), {retries.FAILED_HERE} "
                                   "WHERE job_id = %s", (attempts, error, error_kind, job_id))
                await notify(conn, {"event": "finished", "job_id": job_id})
        self._drop(job_id)
        log.info("fleet: job %s failed on box %s (attempt %d, %s): %s -> %s", job_id, self.box, attempts,
                 error_kind, error[:200], new_state)
        return Failed(new_state, recorded=True)

    @contextlib.asynccontextmanager
    async def _unanswered_try(self, job_id: str) -> AsyncIterator[None]:
        """Around a settle's transaction: where the call fails with a ResourceError (a database error,
        the connection lost, also after its commit went through), the job is marked as having had a
        settle go unanswered, so that the next try (:class:`~.worker.FleetWorker` tries again) asks
        whether the row already shows it. Without that, a result or failure committed just before
        the connection dropped read on the next try as the job "already ended": a run that ended was
        counted nowhere (``completed``, ``cuzk_fleet_job_failures_total``). The mark stays until a try is
        answered or the claim is let go (:meth:`forget`), also where a heartbeat meanwhile found the job
        settled and dropped the claim: its own write is what it found."""
        try:
            yield
        except ResourceError:
            claimed = held.claimed if (held := self._held.get(job_id)) is not None else self._unanswered.get(job_id)
            if claimed is not None:
                self._unanswered[job_id] = claimed
            raise
        self._unanswered.pop(job_id, None)

    async def _failed_by_this_claim(self, conn: psycopg.AsyncConnection, job_id: str, error: str,
                                    error_kind: str) -> JobState | None:
        """The state an earlier, unanswered try of this failure recorded (None: it recorded nothing, or
        no try went unanswered), from what only that write leaves in the job's row: one more attempt
        than at this claim and this box in ``failed_on``, and either no claim since (a lapse that ended
        the job counts an attempt too, but as ``WorkerDied``) or, claimed again since by another box,
        this failure still the last error recorded (a lapse counts the attempt but writes no error).
        A cancel after it changes the state only."""
        c = self._unanswered.get(job_id)
        if c is None:
            return None
        cur = await conn.execute(
            "SELECT state, attempts FROM cuzk_fleet_jobs WHERE job_id = %s AND attempts > %s "
            "AND %s = ANY(failed_on) AND ((claims = %s AND attempts = %s AND error_kind IS DISTINCT FROM "
            "'WorkerDied') OR (claims > %s AND error = %s AND error_kind = %s))",
            (job_id, c.attempts, self.box, c.claims, c.attempts + 1, c.claims, error, error_kind))
        row = await cur.fetchone()
        if row is None:
            return None
        return "failed" if row[0] == "failed" and row[1] == c.attempts + 1 else "queued"

    async def release(self, job_id: str) -> bool:
        """Give a held job back to the queue at once (this box is stopping); no attempt is counted."""
        async with self._tx() as (conn, queries):
            await self._lock_queue_row(conn, job_id)
            cur = await conn.execute(
                "UPDATE cuzk_fleet_jobs SET state = 'queued', owner = NULL WHERE job_id = %s AND owner = %s "
                "AND state = 'running' RETURNING queue_id, circuit_id", (job_id, self.instance))
            row = await cur.fetchone()
            if row is not None:
                queue_job = await self._queue_job(queries, job_id, row[0])
                if queue_job is not None:
                    await queries.retry_job(queue_job, timedelta(0), None)
                await notify(conn, {"event": "requeued", "circuit_id": row[1]})
        self._drop(job_id)
        return row is not None

    async def cancel(self, job_id: str, client: str | None = None) -> bool:
        """Cancel a job from any box: False if it had already ended (InputError if unknown).

        A queued job never runs; a running one is aborted on its box through the library's
        cancellation NOTIFY (and, should that be missed, at that box's next heartbeat).
        ``job_id`` and ``client`` are read as by :meth:`status`.
        """
        job_id = (await self.status(job_id, client)).job_id
        async with self._tx() as (conn, queries):
            await self._lock_queue_row(conn, job_id)
            cur = await conn.execute(
                "UPDATE cuzk_fleet_jobs SET state = 'cancelled', finished_at = now(), error = 'cancelled', "
                "error_kind = 'Cancelled' WHERE job_id = %s AND state IN ('queued', 'running') "
                "RETURNING queue_id, box", (job_id,))
            row = await cur.fetchone()
            if row is None:
                return False
            if row[0] is not None:
                await queries.mark_job_as_cancelled([JobId(row[0])])
            await notify(conn, {"event": "finished", "job_id": job_id})
        log.info("fleet: box %s cancelled job %s", self.box, job_id)
        return True

    async def _lock_queue_row(self, conn: psycopg.AsyncConnection, job_id: str) -> None:
        """Lock the job's queue row (if it still has one) before its job row is touched.

        :meth:`claim` locks in that order (the library's dequeue locks queue rows, then our job rows
        are updated); a cancel, result, failure or release that locked the job row first and then
        the queue row deadlocked with a claim of the same job, and PostgreSQL aborted one of the
        two: a client's cancel failed with a deadlock error. The job's queue_id never changes.
        """
        await conn.execute(sql.SQL("SELECT 1 FROM {} WHERE id = (SELECT queue_id FROM cuzk_fleet_jobs "
                                   "WHERE job_id = %s) FOR UPDATE").format(self._queue_table), (job_id,))

    async def _queue_job(self, queries: Queries, job_id: str, queue_id: int | None) -> pgq.Job | None:
        held = self._held.get(job_id)
        if held is not None:
            return held.queue_job
        return None if queue_id is None else await queries.queue_job_by_id(JobId(queue_id))

    async def _settle(self, queries: Queries, job_id: str, queue_id: int | None, status: JOB_STATUS) -> None:
        queue_job = await self._queue_job(queries, job_id, queue_id)
        if queue_job is not None:
            await queries.log_jobs([(queue_job, status, None)])

    def _drop(self, job_id: str) -> Claimed | None:
        held = self._held.pop(job_id, None)
        if held is None:
            return None
        self._by_queue_id.pop(int(held.queue_job.id), None)
        return held.claimed
