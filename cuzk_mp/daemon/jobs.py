"""The job table: every job the daemon accepted, from submit to pruning.

This module owns the daemon's own view of jobs: request ids, waiters, the journal, retention.
The engine owns their execution, their ordering (priority, then submit order) and the
validation of their inputs. It gives the lifecycle APIs cuzk lacked (idempotent submits,
real await timeouts, cancel, results kept for a while) real behaviour:

* **Idempotency.** ``request_id`` is the job's key and id. A repeat with the same inputs returns
  the existing job (queued, running or finished and not yet pruned); a repeat with *different*
  inputs is an InputError, never a silent second job.
* **Validation once.** The engine validates a job as it queues it (``RunningEngine.submit``);
  a job it refuses is refused to the client and never journaled.
* **Durability.** A job is written to the journal before the submit is acknowledged (if the write
  fails, the job is cancelled in the engine and the submit fails). Concurrent repeats of one
  request_id wait for the first one's journal write.
* **Waiting with a real timeout.** AwaitProof returns when the job ends or when ``timeout_s``
  passes (then ``timed_out`` is set and the job goes on).
* **Cancel.** Forwarded to the engine (queued partitions are dropped, running ones stop at the
  next boundary); the final ``cancelled`` state arrives through the engine's callback.
* **Retention.** Finished jobs answer AwaitProof for ``result_ttl`` seconds, then are pruned from
  the journal and then from memory (a journal that cannot be written keeps them in both).
* **Results after the journal.** A job's waiters (AwaitProof, Prove) get its result only once
  its final state is journaled, so a crash never makes a job whose proofs a client holds run
  again. A journal write that fails (a full disk) refuses the submit it was for (ResourceError);
  a final state that cannot be written is logged, given to the waiters all the same (they are not
  held hostage by the disk), kept in memory and written again at each pruning round and at
  shutdown; while it is not written the journal says ``queued``, so a restart before then runs the
  job again rather than lose it.
* **Shutdown.** While the daemon drains, only completed jobs and client-requested cancellations
  are final; a job the engine gives up because it is stopping stays ``queued`` in the journal
  and runs again after the restart.
* **Bounded queue.** Until a job finishes, its input bytes (input JSON, witnesses: up to
  ``max_frame_bytes`` a job) stay in memory, in its record and in the engine's task, so a submit
  beyond a cap (:class:`~.queue_caps.QueueCaps`: ``[daemon] max_queued_jobs``, ``max_queued_input``,
  ``max_jobs_per_owner``) is refused with Unavailable naming the cap and the figures
  (:func:`~.queue_caps.check_caps`, the rule a fleet's queue applies too; exit 3: the client
  sends it again later, under the same request_id). A repeat of a job the daemon has is
  answered whatever the caps; a job is admitted into a daemon that holds no unfinished job whatever
  its size (the frame limit bounds it); jobs restored from the journal count and are never refused.
  The figures are running counters (:meth:`JobTable.queued`), kept where a job is accepted, ends,
  is refused or is restored.
* **Fleet jobs.** A job this box claimed from a fleet's shared queue (:mod:`.fleet`) runs through
  :meth:`JobTable.run_claimed`: into the engine like any other, but not journaled (the fleet's
  database is its journal) and kept here only while it runs. A fleet box's submits are counted
  against the caps in the fleet's database, over the whole fleet (:mod:`.queue_caps`), not here.

Engine callbacks arrive on an engine thread; the server forwards them into the loop with
``call_soon_threadsafe``, so every method here runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

import msgspec

from cuzk_mp.daemon.access import Identity, check_priority
from cuzk_mp.daemon.config import CircuitConfig
from cuzk_mp.daemon.job_records import (
    JOB_STATES, TERMINAL, JobRecord, pending_partitions, reply_of, to_partition_out, without_inputs,
)
from cuzk_mp.daemon.journal import Journal, JournalEntry
from cuzk_mp.daemon.metrics import DaemonMetrics
from cuzk_mp.daemon.protocol import JobReply, PartitionIn, Prove, SubmitProof
from cuzk_mp.daemon.queue_caps import Queued, QueueCaps, check_caps
from cuzk_mp.daemon.storage_waits import StorageWaits, refusal
from cuzk_mp.daemon.threads import on_serial_thread
from cuzk_mp.errors import InputError, ResourceError, Unavailable
from cuzk_mp.pipeline.serial import SerialThread
from cuzk_mp.pipeline.types import JobResult, JobSpec, PartitionInput, PartitionResult, Priority

log = logging.getLogger("cuzk_mp.daemon.jobs")

MAX_REQUEST_ID = 128
JOURNAL = "the journal"  # what a submit waits on as it journals its job (:class:`.storage_waits.StorageWaits`)


def _key_file(circuit_id: str) -> str:
    """What a submit of ``circuit_id`` waits on as the engine takes its job (:mod:`.storage_waits`)."""
    return f"the key file of circuit {circuit_id}"


def _log_failure(task: asyncio.Task[Any], what: str) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed: %s", what, task.exception())


class EngineLike(Protocol):
    """The part of :class:`cuzk_mp.pipeline.engine.Engine` the job table drives."""

    def submit(self, job: JobSpec) -> None:
        """Queue a job; InputError (naming the partition) for inputs the circuit cannot take."""

    def cancel(self, job_id: str) -> bool:
        """Cancel a job; False if it is unknown or already finished."""


def digest_of(circuit_id: str, partitions: list[PartitionIn]) -> str:
    """What makes two submits "the same job": the circuit and the partition inputs."""
    h = hashlib.sha256(circuit_id.encode() + b"\0")
    h.update(msgspec.msgpack.encode(partitions))
    return h.hexdigest()


def input_bytes(partitions: Iterable[PartitionIn]) -> int:
    """The input bytes a job keeps in memory until it finishes (what ``max_queued_input`` counts)."""
    return sum(len(p.data) for p in partitions)


class JobTable:
    """Jobs by id, with their waiters; see the module docstring for the rules."""

    def __init__(self, engine: EngineLike, journal: Journal, circuits: dict[str, CircuitConfig],
                 metrics: DaemonMetrics, result_ttl_s: float, caps: QueueCaps = QueueCaps(),
                 max_client_priority: Priority = Priority.CRITICAL) -> None:
        self.engine, self.journal, self.circuits = engine, journal, circuits
        self.metrics, self.result_ttl_s, self.caps = metrics, result_ttl_s, caps
        self.max_client_priority = max_client_priority
        self.jobs: dict[str, JobRecord] = {}
        # Unfinished journaled jobs: job id -> its input bytes, and the figures per owner; kept by
        # _hold and _release, so a submit's caps check costs O(1) however many jobs wait.
        self._held: dict[str, int] = {}
        self._held_bytes = 0
        self._owners: dict[str, list[int]] = {}  # owner -> [jobs, input bytes]
        self.draining = False
        self.closing = asyncio.Event()
        self._writes: set[asyncio.Task[Any]] = set()
        self._unwritten: set[str] = set()  # finished jobs whose final state the journal lacks
        self._unjournaled: set[str] = set()  # jobs run for a fleet: its database keeps them
        self.storage = StorageWaits()  # a submit's calls on a key file or the journal that hang
        self.storage.watch(JOURNAL, lambda: None if self.journal is None else self.journal.busy_since())
        self._handovers: dict[str, SerialThread] = {}  # circuit id -> the thread that hands its jobs to the engine

    # -- submit ---------------------------------------------------------------------------

    def admit(self, req: SubmitProof | Prove, caller: Identity) -> tuple[CircuitConfig, Priority]:
        """The door checks of a submit (not draining, known circuit, request_id bounds, a priority
        ``caller`` may ask: :func:`.access.check_priority`); its circuit and priority (the
        request's, else its circuit's). A fleet box's submits pass here too."""
        if self.draining:
            raise Unavailable("the daemon is shutting down and accepts no new jobs")
        cc = self.circuits.get(req.circuit_id)
        if cc is None:
            raise InputError(f"SubmitProof.circuit_id: unknown circuit {req.circuit_id!r} "
                             f"(configured: {', '.join(sorted(self.circuits)) or 'none'})")
        if len(req.request_id) > MAX_REQUEST_ID or not req.request_id.isprintable():
            raise InputError(f"SubmitProof.request_id: at most {MAX_REQUEST_ID} printable "
                             "characters")
        priority = Priority[req.priority] if req.priority is not None else cc.priority
        check_priority(caller, priority, cc.priority, self.max_client_priority)
        return cc, priority

    async def submit(self, req: SubmitProof | Prove, caller: Identity) -> tuple[JobRecord, bool]:
        """Accept a job (queued in the engine, which validates it, then journaled before the
        reply); returns (record, duplicate).

        ``caller`` is the submitting client (its jobs are recorded under its owner); the job is
        handed to the engine (which reads its key file's header and parses input JSON to validate
        it) on its circuit's hand-over thread, off the loop (:meth:`_to_engine_off_loop`), and waited for as
        :mod:`.storage_waits` says.
        """
        _, priority = self.admit(req, caller)
        owner = caller.owner
        digest = digest_of(req.circuit_id, req.partitions)
        existing = self.jobs.get(req.request_id) if req.request_id else None
        if existing is not None:
            if existing.owner != owner:
                raise InputError(f"SubmitProof.request_id: {req.request_id!r} is already in use; "
                                 "choose another")
            if existing.digest != digest:
                raise InputError(f"SubmitProof.request_id: {req.request_id!r} already names a "
                                 "different job (other circuit or inputs)")
            await asyncio.shield(existing.accepted)
            return existing, True
        key_file = _key_file(req.circuit_id)
        self.storage.check(key_file)  # a call on it hangs: refused now, not after a wait of its own
        self.storage.check(JOURNAL)
        size = input_bytes(req.partitions)
        self._within_caps(owner, size)
        job_id = req.request_id or uuid.uuid4().hex
        rec = JobRecord(job_id=job_id, request_id=req.request_id, circuit_id=req.circuit_id,
                        priority=priority, digest=digest,
                        partitions=list(req.partitions), submitted_at=time.time(), owner=owner)
        self.jobs[job_id] = rec
        self._hold(rec, size)  # before any await: concurrent submits see it
        began: list[float] = []
        try:
            await self._accepting(self._to_engine_off_loop(rec, began), key_file, began,
                                  on_late=lambda taken: self._cancel_taken(taken, job_id))
        except BaseException as e:
            self._refused(rec, e)
            raise
        began = []
        add = asyncio.ensure_future(self.journal.add(self._entry(rec), began))
        try:
            await self._accepting(add, JOURNAL, began)
        except BaseException as e:  # not durable: the job must not run unacknowledged
            self.engine.cancel(job_id)
            self._refused(rec, e)
            if not add.done() and not isinstance(e, asyncio.CancelledError):  # the write hangs and goes on:
                # its removal waits behind it on the journal's thread
                self._later(self.journal.remove([job_id]), f"removing refused job {job_id} from the journal")
            elif not isinstance(e, asyncio.CancelledError):
                with contextlib.suppress(ResourceError):  # the row was not written, or cannot be removed
                    await self.journal.remove([job_id])
            raise
        rec.accepted.set_result(None)
        return rec, False

    async def _accepting(self, call: asyncio.Future[None], what: str, began: list[float],
                         on_late: Callable[[asyncio.Future[None]], None] | None = None) -> None:
        """A submit's call on storage (:meth:`.storage_waits.StorageWaits.wait`); one given up on refuses
        the submit (:func:`.storage_waits.refusal`)."""
        try:
            await self.storage.wait(call, what, began=began, on_late=on_late)
        except TimeoutError as e:
            raise refusal(e) from None

    def _cancel_taken(self, taken: asyncio.Future[None], job_id: str) -> None:
        """The engine took a job after its submit was refused (its key file answered late): it must not run."""
        if not taken.cancelled() and taken.exception() is None:
            self.engine.cancel(job_id)

    def _within_caps(self, owner: str, size: int) -> None:
        """Unavailable (:func:`.queue_caps.check_caps`) if a new job of ``owner`` with ``size``
        input bytes would pass a cap, given the running counters."""
        check_caps(self.caps, self.queued(), self.queued(owner).jobs, size)

    def _hold(self, rec: JobRecord, size: int) -> None:
        """Count an unfinished journaled job (and its input bytes) against the caps."""
        if rec.job_id in self._held:
            return
        self._held[rec.job_id] = size
        self._held_bytes += size
        figures = self._owners.setdefault(rec.owner, [0, 0])
        figures[0] += 1
        figures[1] += size

    def _release(self, rec: JobRecord) -> None:
        """A job no longer holds its inputs (it ended, or was refused): they are dropped
        (:func:`.job_records.without_inputs`) and its place is free."""
        rec.partitions = without_inputs(rec.partitions)
        size = self._held.pop(rec.job_id, None)
        if size is None:
            return
        self._held_bytes -= size
        figures = self._owners[rec.owner]
        figures[0] -= 1
        figures[1] -= size
        if not figures[0]:
            del self._owners[rec.owner]

    def queued(self, owner: str | None = None) -> Queued:
        """Unfinished journaled jobs and their input bytes: every client's, or ``owner``'s."""
        if owner is None:
            return Queued(len(self._held), self._held_bytes)
        jobs, size = self._owners.get(owner, (0, 0))
        return Queued(jobs, size)

    async def run_claimed(self, rec: JobRecord) -> JobRecord:
        """Run a job this box claimed from a fleet: into the engine (which validates it), not
        journaled; returns the record once the job ended. Cancelling the caller cancels the job
        in the engine. The record is dropped from the table when this returns.

        Such a job is not counted against this table's :class:`~.queue_caps.QueueCaps`: the fleet's
        worker claims at most ``[fleet] max_jobs`` of them at once (its free slots), so they are
        bounded already; the fleet's unfinished jobs wait in its database and ``inputs_dir``, where
        the fleet counts them against the caps at submit (:meth:`.fleet.submits.FleetSubmits.submit`).

        Every timestamp of ``rec`` is this box's clock, like the engine's ``started_at`` and
        ``finished_at`` that end the job: ``submitted_at`` is the caller's conversion of the
        database's submit time (the claim's time here less the queue wait the database measured,
        :attr:`.fleet.models.Claimed.submitted_here`), so the job's latency (``observe_job``, the
        log) never subtracts one clock from another, whatever the skew between the box and the
        database."""
        if rec.job_id in self.jobs:
            raise ResourceError(f"job {rec.job_id} is already running on this box")
        self.jobs[rec.job_id] = rec
        self._unjournaled.add(rec.job_id)
        try:
            await self._to_engine_off_loop(rec)
            rec.accepted.set_result(None)
            try:
                await rec.done.wait()
            except asyncio.CancelledError:
                self.engine.cancel(rec.job_id)
                raise
            return rec
        finally:
            self.jobs.pop(rec.job_id, None)
            self._unjournaled.discard(rec.job_id)

    def journaled(self, job_id: str) -> bool:
        """Whether the job is one this daemon accepted itself (journaled), not one run for a fleet."""
        return job_id in self.jobs and job_id not in self._unjournaled

    def _refused(self, rec: JobRecord, e: BaseException) -> None:
        self.jobs.pop(rec.job_id, None)
        self._release(rec)
        rec.accepted.set_exception(e)
        rec.accepted.exception()  # retrieved: waiters re-raise it; no "never retrieved" log

    def _entry(self, rec: JobRecord) -> JournalEntry:
        return JournalEntry(job_id=rec.job_id, request_id=rec.request_id,
                            circuit_id=rec.circuit_id, priority=int(rec.priority),
                            digest=rec.digest, partitions=rec.partitions,
                            submitted_at=rec.submitted_at, owner=rec.owner)

    def _to_engine_off_loop(self, rec: JobRecord, began: list[float] | None = None) -> asyncio.Future[None]:
        """:meth:`_to_engine` on the circuit's hand-over thread (a daemon thread, :mod:`.threads`): the engine
        reads the key file's header as it accepts a job (it pins the job to that key), and parses input JSON;
        on a key whose mount hangs that read never returns, and on the loop it stopped every other request
        and the stop; on the default executor it held a thread, and the process's exit, for ever. One thread
        a circuit, so that its jobs reach the engine in the order they were submitted (a thread a submit let a
        slow header read put the first job behind the next), and a circuit whose key hangs holds no other's.
        ``began``: :func:`.threads.on_serial_thread`'s."""
        thread = self._handovers.get(rec.circuit_id)
        if thread is None:
            thread = self._handovers[rec.circuit_id] = SerialThread(f"cuzk-submit-{rec.circuit_id}")
            self.storage.watch(_key_file(rec.circuit_id), lambda: thread.running_since)
        return on_serial_thread(thread, self._to_engine, rec, began=began)

    def _to_engine(self, rec: JobRecord) -> None:
        parts = [PartitionInput(kind=p.kind, data=p.data, seed=p.seed) for p in rec.partitions]
        self.engine.submit(JobSpec(job_id=rec.job_id, circuit_id=rec.circuit_id,
                                   partitions=parts, priority=rec.priority))

    # -- queries, waiting, cancel ---------------------------------------------------------

    def get(self, job_id: str, owner: str | None = None) -> JobRecord:
        """The job, or InputError naming the unknown (or already pruned) id; with ``owner``
        (None: any), another client's job is unknown too."""
        rec = self.jobs.get(job_id)
        if rec is None or (owner is not None and rec.owner != owner):
            raise InputError(f"job_id: unknown job {job_id!r} (never submitted, or its result "
                             f"was pruned after result_ttl = {self.result_ttl_s:g} s)")
        return rec

    async def wait(self, job_id: str, timeout_s: float | None,
                   owner: str | None = None) -> tuple[JobRecord, bool]:
        """Wait until the job ends or ``timeout_s`` passes; returns (record, timed_out)."""
        rec = self.get(job_id, owner)
        if rec.done.is_set():  # ended and journaled: its result is the answer
            return rec, False
        if timeout_s is not None and timeout_s < 0:
            raise InputError(f"AwaitProof.timeout_s: must be >= 0, got {timeout_s}")
        done = asyncio.ensure_future(rec.done.wait())
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({done, closing}, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            closing.cancel()
        if rec.done.is_set():
            return rec, False
        if self.closing.is_set():
            raise Unavailable(f"the daemon is shutting down; job {job_id} is journaled and "
                                "resumes when the daemon restarts")
        return rec, True

    def cancel(self, job_id: str, owner: str | None = None) -> tuple[JobRecord, bool]:
        """Ask the engine to cancel the job; (record, whether a cancel was started)."""
        rec = self.get(job_id, owner)
        if rec.state in TERMINAL:
            return rec, False
        ok = self.engine.cancel(job_id)
        rec.cancel_requested = rec.cancel_requested or ok
        return rec, ok

    def reply(self, rec: JobRecord, id: int, timed_out: bool = False) -> JobReply:
        """The wire reply for a job; one that ended but is not journaled yet is still ``running``
        to a client (its end is not final until a restart cannot run it again)."""
        out = reply_of(rec, id, timed_out)
        if rec.state in TERMINAL and not rec.done.is_set():
            out = msgspec.structs.replace(out, state="running")
        return out

    def in_use(self, circuit_id: str) -> bool:
        """Whether a queued or running job uses the circuit."""
        return any(r.circuit_id == circuit_id and r.state not in TERMINAL
                   for r in self.jobs.values())

    def counts(self) -> dict[str, int]:
        """Jobs per state."""
        out = {s: 0 for s in JOB_STATES}
        for r in self.jobs.values():
            out[r.state] += 1
        return out

    # -- engine callbacks (on the loop thread) --------------------------------------------

    def on_partition_done(self, job_id: str, result: PartitionResult) -> None:
        """Record one partition's result as soon as it is known."""
        rec = self.jobs.get(job_id)
        if rec is None or rec.state in TERMINAL:
            return
        if result.proof is None and (self.draining or result.error_kind == "Cancelled"):
            return  # not final: the job's own result (or the journal, when draining) decides
        if rec.state == "queued":
            rec.state = "running"
        rec.started_at = rec.started_at or (time.time() - result.timings.get("total", 0.0))
        self._count_partition(rec, result)
        rec.results[result.index] = to_partition_out(result)

    def _count_partition(self, rec: JobRecord, result: PartitionResult) -> None:
        if result.index in rec.counted or result.error_kind == "Cancelled":
            return
        rec.counted.add(result.index)
        ok = result.error is None and result.proof is not None
        self.metrics.observe_partition(rec.circuit_id, ok, result.timings, result.device)

    def on_job_done(self, result: JobResult) -> None:
        """Record a job's end, journal it and wake its waiters."""
        rec = self.jobs.get(result.job_id)
        if rec is None or rec.state in TERMINAL:
            return
        if not rec.accepted.done():  # ended before its journal row was written: record it after that

            def once_accepted(accepted: asyncio.Future[None]) -> None:
                if accepted.exception() is None:
                    self.on_job_done(result)

            rec.accepted.add_done_callback(once_accepted)
            return
        journaled = rec.job_id not in self._unjournaled
        if self.draining and journaled and result.state != "done" and not rec.cancel_requested:
            log.info("[shutdown] job %s stopped by the drain (%s); it stays in the journal and "
                     "runs again after a restart", rec.job_id, result.state)
            return
        rec.state = result.state if result.state in TERMINAL else "failed"
        self._release(rec)  # ended: its inputs are not needed again
        rec.error = result.error
        rec.key_digest = result.key_digest
        rec.started_at = result.started_at or rec.started_at
        rec.finished_at, rec.finished_mono = result.finished_at, time.monotonic()
        for p in result.partitions:
            self._count_partition(rec, p)
            rec.results[p.index] = to_partition_out(p)
        kinds = [p.error_kind for p in result.partitions  # the cause, not its knock-on effect
                 if p.error_kind and p.error_kind != "Cancelled"]
        rec.error_kind = ("Cancelled" if rec.state == "cancelled" else kinds[0] if kinds
                          else "ProofError" if rec.state == "failed" else None)
        self.metrics.observe_job(rec.circuit_id, rec.state, rec.latency_s)
        if journaled:
            self._write_final(rec)  # its waiters get the result once the journal has it
        else:
            rec.done.set()
        log.info("job %s %s (%d partitions, %.3f s)", rec.job_id, rec.state,
                 len(rec.partitions), rec.latency_s)

    def _write_final(self, rec: JobRecord) -> None:
        """Journal a job's final state in the background, then wake its waiters: a result is given
        out only once a restart cannot run the job again (see the module docstring on failures)."""
        self._later(self._journal_final(rec), f"journaling job {rec.job_id}'s end").add_done_callback(
            lambda _: rec.done.set())

    def _later(self, write: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        """``write`` on the journal in the background, waited for by :meth:`flush`; its failure is logged."""
        task = asyncio.ensure_future(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        task.add_done_callback(lambda t: _log_failure(t, what))
        return task

    async def _journal_final(self, rec: JobRecord, again: bool = False) -> bool:
        began: list[float] = []
        write = asyncio.ensure_future(self.journal.finish(rec.job_id, reply_of(rec, 0), rec.partitions, began))
        try:  # a write that hangs holds the job's waiters no longer than a submit's (:mod:`.storage_waits`)
            await self.storage.wait(write, JOURNAL, began=began)
        except (ResourceError, TimeoutError) as e:
            if not again:
                log.error("job %s %s, but %s; it is written again at the next pruning round (until then "
                          "a restart runs the job again)", rec.job_id, rec.state, e)
            self._unwritten.add(rec.job_id)
            return False
        if again:
            log.info("job %s: its final state is journaled now", rec.job_id)
        self._unwritten.discard(rec.job_id)
        return True

    async def write_pending(self) -> int:
        """Journal the final states that could not be written before; how many are still unwritten (all,
        without a try, while a write of the journal hangs: another would only queue behind it)."""
        if self.storage.hung_for(JOURNAL) is not None:
            return len(self._unwritten)
        for job_id in sorted(self._unwritten):
            rec = self.jobs.get(job_id)
            if rec is None:
                self._unwritten.discard(job_id)
            elif not await self._journal_final(rec, again=True):
                break  # the journal still refuses: the next round tries again
        return len(self._unwritten)

    async def flush(self) -> None:
        """Wait for every pending journal write, then try the unwritten ones once more (before closing
        the journal); a final state still unwritten is logged: that job runs again after a restart."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
        if self._unwritten and await self.write_pending():
            log.error("[shutdown] the journal still cannot be written: %d finished jobs (%s) run again after "
                      "a restart", len(self._unwritten), ", ".join(sorted(self._unwritten)[:5]))

    def close(self) -> None:
        """At the daemon's stop: the hand-over threads end once their calls have (one stuck on a dead mount
        keeps its thread, a daemon thread the process's exit does not wait for)."""
        for thread in self._handovers.values():
            thread.close(0)

    # -- retention and restart ------------------------------------------------------------

    async def prune(self, now: float | None = None) -> int:
        """Journal what could not be written before, then drop finished jobs older than ``result_ttl``
        from the journal and then from memory; returns how many were dropped. While the journal
        cannot be written nothing is dropped (ResourceError): a pruned job must not come back.

        Ages are on ``time.monotonic()`` (``now``, when given, is on that clock): a wall clock set a
        day ahead must not drop every result at once, nor one set back keep them an hour longer."""
        await self.write_pending()
        now = time.monotonic() if now is None else now
        old = [j for j, r in self.jobs.items() if r.state in TERMINAL and r.finished_mono is not None
               and r.finished_mono + self.result_ttl_s <= now]
        await self.journal.remove(old)
        for j in old:
            self.jobs.pop(j, None)
            self._unwritten.discard(j)
        return len(old)

    async def restore(self, entries: Iterable[JournalEntry]) -> tuple[int, int]:
        """Load the journal at start-up: keep finished results, resubmit the rest in order (each handed
        to the engine off the loop, :meth:`_to_engine_off_loop`: on a key whose mount hangs it never
        returns, and the daemon's stop must still be heard).

        Returns (finished kept, resubmitted). A job whose circuit is no longer configured, or
        that the engine now refuses, is failed (and journaled as such) instead.
        """
        kept = resubmitted = 0
        for e in entries:
            rec = JobRecord.from_entry(e)
            self.jobs[rec.job_id] = rec
            if rec.state in TERMINAL:
                kept += 1
                continue
            self._hold(rec, input_bytes(rec.partitions))  # accepted before: counted, never refused
            try:
                if rec.circuit_id not in self.circuits:
                    raise InputError(f"circuit {rec.circuit_id!r} is no longer configured")
                await self._to_engine_off_loop(rec)
                resubmitted += 1
            except InputError as err:
                self._fail_restored(rec, str(err))
        return kept, resubmitted

    def _fail_restored(self, rec: JobRecord, message: str) -> None:
        rec.state, rec.error, rec.error_kind = "failed", message, "InputError"
        self._release(rec)
        rec.finished_at, rec.finished_mono = time.time(), time.monotonic()
        rec.results = {i: p for i, p in enumerate(pending_partitions(rec, "failed"))}
        self.metrics.observe_job(rec.circuit_id, rec.state, rec.latency_s)
        self._write_final(rec)
        log.warning("[start] journaled job %s cannot run again: %s", rec.job_id, message)
