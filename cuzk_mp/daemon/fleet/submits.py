"""What a box does for its clients on the fleet's shared queue: submit a job, and wait for its end.

Why a module of its own: these operations touch no claim of this box (a box that holds no job
submits and waits as well), so they read apart from the claims, heartbeats and settling of
:class:`~.queue.Fleet`, which is a :class:`FleetSubmits`. A submit is one transaction: the
request-id row, the caps' count under a fleet-wide lock (:mod:`cuzk_mp.daemon.queue_caps`), the
pgqueuer queue row and our job row commit together; the same ``request_id`` from any box returns
the same job. A waiter sleeps on LISTEN/NOTIFY (no polling) and reads the job's row again when
woken, when the LISTEN link is back after an outage, or after a long safety-net interval.

Errors: bad arguments raise InputError naming the field; a submit beyond a cap raises Unavailable;
an unreachable database raises ResourceError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg_pool import AsyncConnectionPool

from cuzk_mp.daemon.fleet import schema
from cuzk_mp.daemon.fleet.config import FleetConfig
from cuzk_mp.daemon.fleet.inputs import StagedInputs, check_ref
from cuzk_mp.daemon.fleet.models import JobRef, JobStatus, entrypoint, queue_priority
from cuzk_mp.daemon.fleet.store import FleetStore
from cuzk_mp.daemon.fleet.waits import share_within
from cuzk_mp.daemon.threads import within
from cuzk_mp.daemon.queue_caps import Queued, QueueCaps, check_caps
from cuzk_mp.errors import InputError, ResourceError, Unavailable
from cuzk_mp.pipeline.types import Priority

log = logging.getLogger("cuzk_mp.daemon.fleet")

OUTAGE_RECHECK_S = 5.0  # a waiter whose read failed reads again this soon (or when the LISTEN link is back)
MIN_READ_S = 1.0  # a waiter's read may take this long even at its deadline (a timeout of 0 still reads once)
AWAIT_RECHECK_S = 60.0  # a safety net only: waiters wake on NOTIFY, and on every LISTEN reconnect
MAX_CIRCUIT_ID_CHARS = 64
NO_CAPS = QueueCaps()
STAGE_TRIES = 3  # a submit's stagings of its inputs (see submit: one pruned meanwhile is staged again)


class FleetSubmits(FleetStore):
    """A handle on the shared queue that submits jobs and waits for their results (the part of a
    box's :class:`~.queue.Fleet` that holds no claim)."""

    def __init__(self, cfg: FleetConfig, pool: AsyncConnectionPool) -> None:
        super().__init__(cfg, pool)
        self.box = cfg.box
        self._waiters: dict[str, set[asyncio.Event]] = {}

    # -- submit ---------------------------------------------------------------------------

    async def submit(self, request_id: str | None, circuit_id: str, inputs_ref: str, inputs_sha256: str,
                     priority: Priority = Priority.NORMAL, n_partitions: int = 1, *, client: str = "",
                     input_bytes: int = 0, caps: QueueCaps = NO_CAPS,
                     stage: Callable[[], StagedInputs] | None = None) -> JobRef:
        """Queue a job; the same non-empty ``request_id`` from any box returns the same job.

        A repeat with a different circuit or inputs is an InputError, never a second job; so is a
        repeat from another ``client`` (the submitting client's identity, recorded with the job).
        A new job beyond one of ``caps`` (the accepting box's ``[daemon]`` caps, applied to the
        whole fleet's unfinished jobs, their ``input_bytes`` and the ``client``'s: see
        :mod:`cuzk_mp.daemon.queue_caps` for why) is refused with Unavailable; a repeat is
        answered whatever the caps. The request-id row, the caps' count, the queue row and the job
        row are one transaction.

        ``stage`` writes the inputs' bytes beside their file (:func:`~.inputs.stage_inputs`, run in a
        thread before the transaction: a write of hundreds of megabytes to a slow share never holds a
        transaction open, which the server ends once idle for the stall timeout, :func:`.store.connect_kwargs`);
        the transaction puts them in place first, under the inputs' lock (:func:`~.schema.inputs_lock`):
        pruning, which takes that lock to check that no job names a file before it removes it, then
        never removes a file a job is being queued with, whatever the shared folder's clocks or
        attribute caches say of its mtime. A file pruned between the stage and the lock is staged again.
        """
        _check_submit(request_id, circuit_id, inputs_ref, inputs_sha256, n_partitions)
        if input_bytes < 0:
            raise InputError(f"input_bytes: must be >= 0, got {input_bytes}")
        try:
            priority = Priority(priority)
        except ValueError:
            raise InputError(f"priority: one of {', '.join(f'{p.value} ({p.name})' for p in Priority)}, "
                             f"got {priority!r}") from None
        job_id = uuid.uuid4().hex
        for _ in range(STAGE_TRIES):
            staged = None if stage is None else await share_within("storing the job's inputs", stage)
            try:
                ref = await self._enqueue(job_id, request_id, circuit_id, inputs_ref, inputs_sha256, priority,
                                          n_partitions, client, input_bytes, caps, staged)
            finally:
                if staged is not None:
                    with contextlib.suppress(Unavailable):  # what is left there is the prune's
                        await share_within("removing the staged inputs", staged.discard)
            if ref is not None:
                if not ref.duplicate:
                    log.info("fleet: queued job %s (%s, %s, %d partitions)", job_id, circuit_id, priority.name,
                             n_partitions)
                return ref
        raise ResourceError(f"fleet: the inputs {inputs_ref} were removed as stale again and again while being "
                            "queued; submit again")

    async def _enqueue(self, job_id: str, request_id: str | None, circuit_id: str, inputs_ref: str,
                       inputs_sha256: str, priority: Priority, n_partitions: int, client: str, input_bytes: int,
                       caps: QueueCaps, staged: StagedInputs | None) -> JobRef | None:
        """The transaction of :meth:`submit`; None where its staged inputs' file was pruned meanwhile."""
        async with self._tx() as (conn, queries):
            if staged is not None:  # lock order: the inputs' lock, then the caps' lock below
                await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", schema.inputs_lock(inputs_sha256))
                if not await share_within("putting the job's inputs in place", _place, staged):
                    return None  # (a folder that hangs: Unavailable rolls the transaction back, its locks with it)
            if caps:
                # Count and insert under one fleet-wide lock, so two submits racing at a cap (from any
                # boxes) never both pass. Lock order: this lock first, then the new request-id row (a
                # submit of the same request_id waits on it otherwise), then the new queue and job
                # rows. No other operation takes this lock, and a submit locks no existing queue or
                # job row, so it never joins the queue-row-then-job-row order of the settling ones.
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (schema.SUBMIT_LOCK_KEY,))
            if request_id:
                cur = await conn.execute(
                    "INSERT INTO cuzk_fleet_requests (request_id, job_id) VALUES (%s, %s) "
                    "ON CONFLICT (request_id) DO NOTHING RETURNING job_id", (request_id, job_id))
                if await cur.fetchone() is None:
                    return await self._existing(conn, request_id, circuit_id, inputs_sha256, client)
            if caps:  # raising rolls the request-id row back with the rest
                check_caps(caps, *await self._unfinished(conn, client), input_bytes, fleet=True)
            [queue_id] = await queries.enqueue(entrypoint(circuit_id), job_id.encode(), queue_priority(priority))
            await conn.execute(
                "INSERT INTO cuzk_fleet_jobs (job_id, request_id, circuit_id, priority, n_partitions, "
                "inputs_ref, inputs_sha256, input_bytes, queue_id, submitted_by, client) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (job_id, request_id or None, circuit_id, int(priority), n_partitions, inputs_ref,
                 inputs_sha256, input_bytes, queue_id, self.box, client))
        return JobRef(job_id, "queued")

    async def precheck(self, request_id: str | None, client: str, input_bytes: int, caps: QueueCaps) -> None:
        """Unavailable if a new job would be refused by :meth:`submit` for ``caps`` as the queue is
        now; nothing for a ``request_id`` the fleet has (a repeat is never refused).

        An early look, without the submit's lock, so that a box refuses a submit before it stores
        its inputs in the shared ``inputs_dir``; :meth:`submit` decides, with the lock.
        """
        if not caps:
            return
        async with self._tx() as (conn, _):
            if request_id:
                cur = await conn.execute("SELECT 1 FROM cuzk_fleet_requests WHERE request_id = %s", (request_id,))
                if await cur.fetchone() is not None:
                    return
            check_caps(caps, *await self._unfinished(conn, client), input_bytes, fleet=True)

    @staticmethod
    async def _unfinished(conn: psycopg.AsyncConnection, client: str) -> tuple[Queued, int]:
        """The fleet's unfinished (queued or running) jobs and their input bytes, and how many of
        them are ``client``'s."""
        cur = await conn.execute(
            "SELECT count(*), COALESCE(sum(input_bytes), 0), count(*) FILTER (WHERE client = %s) "
            "FROM cuzk_fleet_jobs WHERE state IN ('queued', 'running')", (client,))
        row = await cur.fetchone()
        assert row is not None  # an aggregate always returns its row
        return Queued(int(row[0]), int(row[1])), int(row[2])

    @staticmethod
    async def _existing(conn: psycopg.AsyncConnection, request_id: str, circuit_id: str,
                        inputs_sha256: str, client: str) -> JobRef:
        cur = await conn.execute(
            "SELECT j.job_id, j.state, j.circuit_id, j.inputs_sha256, j.client FROM cuzk_fleet_requests r "
            "JOIN cuzk_fleet_jobs j USING (job_id) WHERE r.request_id = %s", (request_id,))
        row = await cur.fetchone()
        if row is None:
            raise ResourceError(f"request_id {request_id!r}: its job is being removed; submit again")
        if row[4] != client:
            raise InputError(f"request_id: {request_id!r} is already in use; choose another")
        if (row[2], row[3]) != (circuit_id, inputs_sha256):
            raise InputError(f"request_id: {request_id!r} already names job {row[0]} with different "
                             f"inputs ({row[2]}, sha256 {row[3][:12]}...)")
        return JobRef(row[0], row[1], duplicate=True)

    # -- reading --------------------------------------------------------------------------

    async def await_result(self, job_id: str, timeout_s: float | None, client: str | None = None) -> JobStatus:
        """Wait (LISTEN/NOTIFY, no polling) until the job ends or ``timeout_s`` passes; its status.

        On a timeout the returned status is not ``finished``; the job goes on. ``job_id`` and
        ``client`` are read as by :meth:`status`. Each read is bounded by the time left; once the
        job has been read, a read the database does not answer (an outage) is waited through, as
        the job goes on in the fleet: the waiter reads again when the LISTEN link is back, or after
        :data:`OUTAGE_RECHECK_S`, and at the deadline it answers with what it last read. A cancel (the
        client gone, the daemon stopping) ends the wait, also one that comes as a notification wakes it
        (:func:`cuzk_mp.daemon.threads.within`).
        """
        ev = asyncio.Event()
        key = job_id
        self._waiters.setdefault(key, set()).add(ev)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        st: JobStatus | None = None
        try:
            while True:
                ev.clear()  # before the read: a NOTIFY committed after it sets the event again
                left = None if deadline is None else max(deadline - time.monotonic(), MIN_READ_S)
                try:
                    st = await within(self.status(key, client), left)
                except (ResourceError, asyncio.TimeoutError) as e:
                    if st is None:  # nothing known of the job yet: the caller hears it now
                        raise ResourceError(f"fleet: the database did not answer a read of job {job_id} "
                                            f"({e or 'in time'})") from None
                    if (deadline is not None and time.monotonic() >= deadline) or self._closed:
                        return st
                    log.info("fleet: waiting for job %s through a database outage (%s)", key, e or "no answer")
                    pause = OUTAGE_RECHECK_S if deadline is None else min(OUTAGE_RECHECK_S, deadline - time.monotonic())
                    with contextlib.suppress(asyncio.TimeoutError):
                        await within(ev.wait(), max(pause, 0.0))
                    continue
                if st.job_id != key:  # named by its request_id: wait under the job id, then read again
                    self._unwait(key, ev)
                    key = st.job_id
                    self._waiters.setdefault(key, set()).add(ev)
                    continue
                left = AWAIT_RECHECK_S if deadline is None else deadline - time.monotonic()
                if st.finished or left <= 0 or self._closed:
                    return st
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(ev.wait(), min(left, AWAIT_RECHECK_S))
        finally:
            self._unwait(key, ev)

    def _unwait(self, job_id: str, ev: asyncio.Event) -> None:
        waiters = self._waiters.get(job_id)
        if waiters is not None:
            waiters.discard(ev)
            if not waiters:
                del self._waiters[job_id]

    def _wake_waiters(self, job_id: str) -> None:
        for ev in self._waiters.get(job_id, ()):
            ev.set()


def _check_submit(request_id: str | None, circuit_id: str, inputs_ref: str, inputs_sha256: str,
                  n_partitions: int) -> None:
    """InputError naming the first bad argument of a submit."""
    if request_id is not None and (len(request_id) > schema.MAX_REQUEST_ID_CHARS or not request_id.isprintable()):
        raise InputError(f"request_id: at most {schema.MAX_REQUEST_ID_CHARS} printable characters")
    if not circuit_id or len(circuit_id) > MAX_CIRCUIT_ID_CHARS or not circuit_id.isprintable():
        raise InputError(f"circuit_id: 1-{MAX_CIRCUIT_ID_CHARS} printable characters, got {circuit_id!r}")
    if len(inputs_ref) > schema.MAX_REF_CHARS:
        raise InputError(f"inputs_ref: at most {schema.MAX_REF_CHARS} characters")
    check_ref(inputs_ref, inputs_sha256)
    if n_partitions < 1:
        raise InputError(f"n_partitions: must be >= 1, got {n_partitions}")


def _place(staged: StagedInputs) -> bool:
    """:meth:`.inputs.StagedInputs.place`, its failure a ResourceError naming the file."""
    try:
        return staged.place()
    except OSError as e:
        raise ResourceError(f"fleet: cannot store the inputs {staged.ref.ref}: {e}") from None
