"""The engine's bookkeeping of jobs, partitions and attempts: pure state, no processes.

Owns: the job table, one priority queue of partition attempts for all jobs
(ordered by priority, then submit order, then partition index), the state of
every attempt, the stage timings each process reported for it, the retry policy
and the results. The engine calls the ``on_*`` methods as messages arrive and
forwards what they return (finished partitions and jobs, tasks to cancel in the
children) — so every rule about "when is a job done, failed, retried" lives here
and is testable without processes. It renders its own status rows
(:meth:`Scheduler.rows`, :meth:`Scheduler.queue`, :meth:`Scheduler.counters`).

Attempt (task) states: queued -> synthesizing -> ready (in a ring slot) ->
proving -> done, or failed / lost (its process died) / cancelled. A partition
is done by the first attempt that brings a proof, even one already given up
as lost (its late proof is as good as the retry's, which is then cancelled).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from .circuits import key_digest
from .messages import CircuitRef
from .timeline import ProverClocks, synthesis_spans
from .types import JobResult, JobSpec, PartitionInput, PartitionResult, StageSpan

NOT_RETRIED = frozenset({"InputError", "FormatError", "UnsatisfiedWitness", "ConfigError", "Cancelled"})
KEEP_FINISHED = 200  # finished jobs kept for status()


@dataclass
class Task:
    """One attempt of one partition."""

    task_id: int
    job: Job
    index: int
    attempt: int
    state: str = "queued"
    worker: str | None = None  # synthesis process name
    prover: str | None = None  # prover process name
    device: int | None = None
    slot: int | None = None
    # The moments below are time.monotonic() (one clock for every process of the host): the queue wait
    # ends at t_dispatch, the hung-process timer runs from t_held and t_proving, and the partition's
    # stages are placed in time from t_dispatch, t_published and the proof's arrival (:mod:`.timeline`)
    t_dispatch: float | None = None  # when a synthesis worker was handed the attempt
    held_s: float = 0.0  # seconds a synthesis worker held the attempt before ``t_held`` (ring waits left out)
    t_held: float | None = None  # since when it holds it; None while it waits for a free ring slot
    t_proving: float | None = None  # when the engine heard a prover took it
    t_published: float | None = None  # when the engine heard of the publish
    timings: dict[str, float] = field(default_factory=dict)  # stages reported so far, merged

    def held_for(self, now: float) -> float | None:
        """Seconds the process that has the attempt has held it at ``now`` (``time.monotonic()``: a
        step of the wall clock kills nobody): the synthesis worker since dispatch, less its waits
        for a free ring slot; the prover since it took the slot; None where no process holds it."""
        if self.state == "synthesizing":
            if self.t_dispatch is None:
                return None
            return self.held_s + (0.0 if self.t_held is None else now - self.t_held)
        if self.state == "proving":
            return None if self.t_proving is None else now - self.t_proving
        return None

    def order(self) -> tuple[int, int, int, int]:
        """Queue key: priority, job submit order, partition index, attempt id."""
        return (int(self.job.spec.priority), self.job.seq, self.index, self.task_id)


@dataclass
class Job:
    """A submitted job and its partitions' outcomes."""

    spec: JobSpec
    seq: int
    circuit: CircuitRef
    # submitted_at, started_at and finished_at are wall-clock (Unix) times, shown in the status and
    # journaled with the result: no duration is taken from them (a step of the clock moves them)
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    state: str = "queued"  # queued | running | done | failed | cancelled
    error: str | None = None
    results: list[PartitionResult | None] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    current: dict[int, Task] = field(default_factory=dict)  # partition -> its latest attempt
    tasks: list[Task] = field(default_factory=list)  # every attempt, forgotten when the job finishes
    # the submit on time.monotonic(): where the queue wait and the total start, so a step of the wall
    # clock (submitted_at's) makes neither negative nor a day long
    submitted_mono: float = field(default_factory=time.monotonic)
    last_index: int | None = None  # the partition proved last, reported once the key file is read again

    @property
    def finished(self) -> bool:
        """True once done, failed or cancelled."""
        return self.state in ("done", "failed", "cancelled")


class PartitionRow(msgspec.Struct):
    """One partition of a job as the status shows it (states: pending, synthesizing, ready, proving,
    done, failed, cancelled)."""

    index: int
    state: str
    attempts: int
    device: int | None
    timings: dict[str, float]
    error: str | None


class JobRow(msgspec.Struct):
    """One job as the status shows it."""

    job_id: str
    circuit_id: str
    state: str
    priority: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    error: str | None
    partitions: list[PartitionRow]


class QueueStatus(msgspec.Struct):
    """Attempts waiting for a synthesis worker, and attempts in a child process."""

    pending: int
    in_flight: int


class SchedulerCounters(msgspec.Struct):
    """What only grows: jobs and partitions by outcome since the engine started."""

    jobs_submitted: int
    jobs_finished: dict[str, int]  # by final state: done, failed, cancelled
    partitions_proved: int
    partitions_failed: int
    partition_retries: int
    late_proofs_used: int
    partitions_discarded: int = 0  # proved, then not delivered: the job's zkey file changed before its last proof


@dataclass
class Outcome:
    """What the engine must do after a scheduler event."""

    partitions: list[tuple[str, PartitionResult]] = field(default_factory=list)
    jobs: list[JobResult] = field(default_factory=list)
    cancel: list[Task] = field(default_factory=list)  # attempts in children that must be dropped
    # jobs proved whole whose key file the engine reads again, outside its lock, before they are done
    # (Scheduler.on_key_checked): on a hard mount whose server is gone that read never returns
    check_key: list[Job] = field(default_factory=list)

    def merge(self, other: Outcome) -> Outcome:
        """Append another outcome's items to this one."""
        self.partitions += other.partitions
        self.jobs += other.jobs
        self.cancel += other.cancel
        self.check_key += other.check_key
        return self


class Scheduler:
    """Jobs, the partition queue and the retry policy (see the module docstring)."""

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts
        self.jobs: dict[str, Job] = {}
        self.finished: deque[Job] = deque(maxlen=KEEP_FINISHED)
        self.tasks: dict[int, Task] = {}
        self._queue: list[tuple[tuple[int, int, int, int], Task]] = []
        self._ids = itertools.count(1)
        self.clocks = ProverClocks()  # places the provers' stages in time (timeline.py)
        self._seqs = itertools.count(1)
        self._counts: dict[str, int] = {k: 0 for k in (
            "jobs_submitted", "jobs_done", "jobs_failed", "jobs_cancelled", "partitions_proved",
            "partitions_failed", "partition_retries", "late_proofs_used", "partitions_discarded")}

    # ---- queue
    def add_job(self, spec: JobSpec, circuit: CircuitRef) -> Job:
        """Accept a job: one queued attempt per partition."""
        job = Job(spec, next(self._seqs), circuit, time.time())
        job.results = [None] * len(spec.partitions)
        job.attempts = [0] * len(spec.partitions)
        self.jobs[spec.job_id] = job
        for index in range(len(spec.partitions)):
            self._enqueue(job, index)
        self._counts["jobs_submitted"] += 1
        return job

    def _enqueue(self, job: Job, index: int) -> Task:
        job.attempts[index] += 1
        task = Task(next(self._ids), job, index, job.attempts[index])
        self.tasks[task.task_id] = task
        job.current[index] = task
        job.tasks.append(task)
        heapq.heappush(self._queue, (task.order(), task))
        return task

    def next_task(self, started_only: bool = False) -> Task | None:
        """The oldest queued attempt (skipping those of finished jobs), marked dispatched.

        ``started_only`` (engine draining): only attempts of jobs that already started.
        """
        skipped = []
        while self._queue:
            item = heapq.heappop(self._queue)
            task = item[1]
            if task.state != "queued" or task.job.finished:
                continue
            if started_only and task.job.started_at is None:
                skipped.append(item)
                continue
            task.state, task.t_dispatch = "synthesizing", time.monotonic()
            task.held_s, task.t_held = 0.0, task.t_dispatch
            if task.job.started_at is None:
                task.job.started_at, task.job.state = time.time(), "running"
            for back in skipped:
                heapq.heappush(self._queue, back)
            return task
        for back in skipped:
            heapq.heappush(self._queue, back)
        return None

    def pending(self) -> int:
        """Queued attempts not yet dispatched."""
        return sum(1 for _, t in self._queue if t.state == "queued" and not t.job.finished)

    def in_flight(self) -> list[Task]:
        """Attempts in a child process (synthesizing, in the ring, proving)."""
        return [t for t in self.tasks.values() if t.state in ("synthesizing", "ready", "proving")]

    # ---- events from the children
    def on_ring_wait(self, task_id: int, waiting: bool) -> None:
        """A synthesis worker starts or ends waiting for a free ring slot for the attempt."""
        task = self.tasks.get(task_id)
        if task is None or task.state != "synthesizing":
            return
        now = time.monotonic()
        if waiting and task.t_held is not None:
            task.held_s, task.t_held = task.held_s + now - task.t_held, None
        elif not waiting and task.t_held is None:
            task.t_held = now

    def on_published(self, task_id: int, slot: int, timings: dict[str, float] | None = None) -> None:
        """A synthesis worker published the attempt's ring slot; its stage timings join the record."""
        task = self.tasks.get(task_id)
        if task is None:
            return
        task.timings.update(timings or {})
        if task.t_published is None:
            task.t_published = time.monotonic()
        task.slot = slot  # also when the prover's take was heard first
        if task.state == "synthesizing":
            task.state = "ready"

    def on_taken(self, task_id: int, prover: str, device: int | None) -> None:
        """A prover process took the attempt's slot."""
        task = self.tasks.get(task_id)
        if task is not None and task.state in ("synthesizing", "ready"):
            task.state, task.prover, task.device, task.t_proving = "proving", prover, device, time.monotonic()

    def on_proof(self, task_id: int, proof: Any, public: list[int], timings: dict[str, float],
                 device: int | None) -> Outcome:
        """A proof arrived: the partition is done (first proof wins); maybe the job too."""
        task = self.tasks.pop(task_id, None)
        out = Outcome()
        if task is None or task.job.finished or task.job.results[task.index] is not None:
            return out
        job = task.job
        if task.state == "lost":
            self._counts["late_proofs_used"] += 1
            newer = job.current.get(task.index)
            if newer is not None and newer is not task:
                out.cancel.append(self._retire(newer, "cancelled"))
        task.state = "done"
        now = time.monotonic()
        synthesized = dict(task.timings)  # the synthesis worker's (its ring_wait: the wait for a free slot)
        timings = {**task.timings, **timings, "total": now - job.submitted_mono}
        result = PartitionResult(task.index, proof, public, timings, device, job.attempts[task.index],
                                 spans=self._spans(task, synthesized, timings, now))
        job.results[task.index] = result
        self._counts["partitions_proved"] += 1
        out.partitions.append((job.spec.job_id, result))
        if all(r is not None for r in job.results):
            if job.circuit.zkey_id is None:  # no key file to read again
                out.jobs.append(self._finish(job, "done", None))
            else:  # reported with the job's end, once its key file is read again (on_key_checked)
                job.last_index = task.index
                out.partitions.clear()
                out.check_key.append(job)
        return out

    def on_key_checked(self, job_id: str, changed: str | None, kind: str = "InputError") -> Outcome:
        """The engine's read of a job's key file after its last proof (:func:`key_changed`, outside the
        engine's lock): ``changed`` None, the job is done; else it was proved with the key it was accepted
        with, which is no longer the file's (:func:`~.circuits.pinned`), or the file could not be read
        again, and it fails naming why (an error of ``kind``), its proofs discarded. Nothing where the job
        ended meanwhile (a cancel, the engine's stop, a read given up on)."""
        job, out = self.jobs.get(job_id), Outcome()
        if job is None or job.finished:
            return out
        last = job.results[job.last_index] if job.last_index is not None else None
        if changed is None:
            if last is not None:
                out.partitions.append((job_id, last))
            out.jobs.append(self._finish(job, "done", None))
            return out
        self._counts["partitions_discarded"] += len(job.results)
        job.results = [None] * len(job.results)
        return out.merge(self._fail_job(job, changed, {i: (changed, kind) for i in range(len(job.results))}))

    def _spans(self, task: Task, synthesized: dict[str, float], timings: dict[str, float],
               now: float) -> list[StageSpan]:
        """The proved attempt's stages in time (:mod:`.timeline`)."""
        ready_wait = timings.get("ring_wait", 0.0) - synthesized.get("ring_wait", 0.0)  # the prover adds its wait
        before = sum(timings.get(k, 0.0) for k in ("ring_wait", "shm_write", "synthesis", "staging", "device_wait"))
        earliest = None if task.t_dispatch is None else task.t_dispatch + before
        proving = self.clocks.spans(timings, task.prover, task.slot, now, ready_wait, earliest)
        published = min([task.t_published or now, *(s.start for s in proving if s.process.startswith("ring-slot-"))])
        return synthesis_spans(synthesized, task.worker, published, task.t_dispatch) + proving

    def on_failed(self, task_id: int, kind: str, message: str) -> Outcome:
        """An attempt failed in a child that carries on: retry, or fail the job."""
        task = self.tasks.get(task_id)
        if task is None or task.state in ("done", "failed", "cancelled", "lost") or task.job.finished:
            self.tasks.pop(task_id, None)
            return Outcome()
        return self._give_up_or_retry(task, kind, message)

    def on_lost(self, task_ids: list[int], reason: str) -> Outcome:
        """Attempts whose process died: retried once more (up to ``max_attempts``), else the job fails."""
        out = Outcome()
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            if task is None or task.state not in ("synthesizing", "ready", "proving") or task.job.finished:
                continue
            out.merge(self._give_up_or_retry(task, "WorkerDied", reason))
        return out

    def _give_up_or_retry(self, task: Task, kind: str, message: str) -> Outcome:
        job = task.job
        task.state = "lost" if kind in ("WorkerDied", "GpuDead") else "failed"
        if kind not in NOT_RETRIED and job.attempts[task.index] < self.max_attempts:
            self._counts["partition_retries"] += 1
            self._enqueue(job, task.index)
            return Outcome()
        text = f"partition {task.index}: {message} (attempt {job.attempts[task.index]} of {self.max_attempts})"
        if kind in NOT_RETRIED:
            text = f"partition {task.index}: {message}"
        self._counts["partitions_failed"] += 1
        return self._fail_job(job, text, {task.index: (message, kind)})

    # ---- job-level transitions
    def cancel(self, job_id: str) -> Outcome | None:
        """Cancel a job; None if unknown or already finished."""
        job = self.jobs.get(job_id)
        if job is None or job.finished:
            return None
        return self._fail_job(job, None, {}, state="cancelled")

    def fail_all_unstarted(self, message: str) -> Outcome:
        """Fail every job none of whose partitions was dispatched yet (engine draining)."""
        out = Outcome()
        for job in list(self.jobs.values()):
            if job.started_at is None:
                out.merge(self._fail_job(job, message, {}))
        return out

    def fail_all(self, message: str, kind: str | None = None) -> Outcome:
        """Fail every unfinished job (the engine is stopping, or a role keeps dying).

        With ``kind`` (an error kind such as ``WorkerDied``) every unproved partition carries
        ``message`` as its error; without it they read as not proved because the job failed.
        """
        out = Outcome()
        for job in list(self.jobs.values()):
            if not job.finished:
                errors = {} if kind is None else {i: (message, kind) for i in range(len(job.results))}
                out.merge(self._fail_job(job, message, errors))
        return out

    def _fail_job(self, job: Job, error: str | None, errors: dict[int, tuple[str, str]],
                  state: str = "failed") -> Outcome:
        out = Outcome()
        for index, result in enumerate(job.results):
            if result is not None:
                continue
            message, kind = errors.get(index, (f"not proved: job {state}" + (f" ({error})" if error else ""),
                                                "Cancelled"))
            failed = PartitionResult(index, None, [], {}, None, job.attempts[index], message, kind)
            job.results[index] = failed
            out.partitions.append((job.spec.job_id, failed))
            task = job.current.get(index)
            if task is not None and task.state == "queued":
                self._retire(task, "cancelled")
            elif task is not None and task.state in ("synthesizing", "ready", "proving"):
                out.cancel.append(self._retire(task, "cancelled"))
        out.jobs.append(self._finish(job, state, error))
        return out

    def _retire(self, task: Task, state: str) -> Task:
        task.state = state
        self.tasks.pop(task.task_id, None)
        return task

    def _finish(self, job: Job, state: str, error: str | None) -> JobResult:
        finished_at = time.time()
        job.state, job.error, job.finished_at = state, error, finished_at
        self._counts[f"jobs_{state}"] += 1
        self.jobs.pop(job.spec.job_id, None)
        for task in job.tasks:
            self.tasks.pop(task.task_id, None)
        job.tasks = []
        # Kept for the status (KEEP_FINISHED) without its input bytes: a partition's witness or input
        # JSON may be max_frame_bytes, and nothing reads it once the job is over. A new spec: the
        # caller's stays as it gave it.
        job.spec = replace(job.spec, partitions=[PartitionInput(p.kind, seed=p.seed) for p in job.spec.partitions])
        self.finished.append(job)
        results = [r for r in job.results if r is not None]  # every partition has one by now
        return JobResult(job.spec.job_id, job.spec.circuit_id, state, results, error, job.submitted_at,
                         job.started_at, finished_at, key_digest(job.circuit.zkey_id))

    def uses_circuit(self, circuit_id: str) -> bool:
        """True if an unfinished job proves with this circuit."""
        return any(j.spec.circuit_id == circuit_id for j in self.jobs.values())

    # ---- status
    def rows(self) -> list[JobRow]:
        """Every unfinished job, then the last finished ones (``KEEP_FINISHED``)."""
        return [_job_row(j) for j in self.jobs.values()] + [_job_row(j) for j in self.finished]

    def queue(self) -> QueueStatus:
        """Pending and in-flight attempts."""
        return QueueStatus(pending=self.pending(), in_flight=len(self.in_flight()))

    def counters(self) -> SchedulerCounters:
        """The counters since the engine started."""
        c = self._counts
        return SchedulerCounters(
            jobs_submitted=c["jobs_submitted"],
            jobs_finished={s: c[f"jobs_{s}"] for s in ("done", "failed", "cancelled")},
            partitions_proved=c["partitions_proved"], partitions_failed=c["partitions_failed"],
            partition_retries=c["partition_retries"], late_proofs_used=c["late_proofs_used"],
            partitions_discarded=c["partitions_discarded"])


def _partition_rows(job: Job) -> list[PartitionRow]:
    rows = []
    for index, result in enumerate(job.results):
        if result is not None:
            state = "done" if result.proof is not None else ("cancelled" if result.error_kind == "Cancelled"
                                                             else "failed")
            rows.append(PartitionRow(index, state, result.attempts, result.device, result.timings, result.error))
            continue
        task = job.current.get(index)
        state = "pending" if task is None or task.state == "queued" else task.state
        rows.append(PartitionRow(index, state, job.attempts[index], task.device if task else None,
                                 dict(task.timings) if task else {}, None))
    return rows


def _job_row(job: Job) -> JobRow:
    return JobRow(job.spec.job_id, job.spec.circuit_id, job.state, job.spec.priority.name, job.submitted_at,
                  job.started_at, job.finished_at, job.error, _partition_rows(job))
