"""The engine's event thread: children's messages, deaths, restarts, stalls and dispatch.

:class:`~.engine.RunningEngine` runs one thread, ``cuzk-engine-events``, that does all of the
engine's work; this module is that work, kept apart from the running engine's lifecycle and its
callers' entry points (:mod:`.engine`), which only change state under the lock and wake the
thread (:class:`WakePipe`). Each round it waits on every child's pipe and process sentinel and
the wake-up pipe, then, under the engine's lock: reads the messages (a dying child's last words
before its death), handles deaths, kills a child that sent no READY in time or holds a partition
too long, restarts children whose backoff is over, reports a role that keeps dying, and hands
queued partitions to idle synthesis workers; the job and partition callbacks run after, outside
the lock.

Death handling order (kept consistent with :meth:`Ring.reclaim` and
:meth:`Scheduler.on_lost`): read the child's last messages, reap it, reclaim its
ring slots, work out which attempts it took with it, retry or fail those, then
schedule its restart.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from . import messages as msg
from .circuits import CircuitTable, key_changed
from .ring import Ring, SlotRecord
from .scheduler import Outcome, Scheduler, Task
from .serial import SerialThread
from .status import ProverStats
from .supervisor import Death, Degraded, Supervisor
from .types import EngineConfig, JobResult, PartitionResult

log = logging.getLogger("cuzk_mp.pipeline.engine")  # the engine's logger: these lines are the engine's
POLL_S = 0.5
# How long a job whose last proof came waits for the read of its key file that confirms the key (a small
# read: on a working disk milliseconds); past it the file's storage hangs, and the job fails naming it.
KEY_CHECK_WAIT_S = 60.0


class EngineEvents:
    """The event thread's work, a base of :class:`~.engine.RunningEngine`, which sets every attribute
    named here and starts the thread on :meth:`_loop`."""

    config: EngineConfig
    key: Callable[[str], str]
    prefix: str
    ring: Ring
    sup: Supervisor
    circuits: CircuitTable
    sched: Scheduler
    on_job_done: Callable[[JobResult], None] | None
    on_partition_done: Callable[[str, PartitionResult], None] | None
    provers: dict[str, ProverStats]
    _busy_before: dict[str, tuple[int, float]]  # by prover name: (its process's pid, busy seconds of those before it)
    _lock: threading.RLock
    _cond: threading.Condition
    _state: str
    _start_error: str | None
    _degraded: list[Degraded]
    _callbacks: deque[Callable[[], None]]
    _abandoned: bool
    _pipe: WakePipe
    _key_checks: dict[str, SerialThread]  # zkey path -> the thread that reads it after jobs' last proofs
    _key_checks_due: dict[str, tuple[float, msg.CircuitRef]]  # job -> (when its read is given up, its key)

    if TYPE_CHECKING:  # the running engine's lifecycle, which an abandoned stop's rounds finish
        def _kill_children(self) -> None: ...

        def _finish_abandoned(self) -> None: ...

    def _wake(self) -> None:
        self._pipe.wake()

    def _loop(self) -> None:
        while True:
            with self._lock:
                table = self.sup.by_fd()
                restart_in = self.sup.next_restart_in()
            timeout = POLL_S if restart_in is None else min(POLL_S, restart_in + 0.01)
            ready = wait([*table, self._pipe.r], timeout=timeout)
            with self._cond:
                try:
                    self._handle_ready(ready, table)
                    self._give_up_key_checks()
                except Exception:  # noqa: BLE001 - a bug here must be loud, not kill the event thread
                    log.exception("engine event handling failed")
                self._cond.notify_all()
            self._run_callbacks()
            if self._abandoned and self._state == "stopping":
                self._kill_children()
                if not self.sup.live():
                    self._finish_abandoned()
            if self._state == "stopped":  # read after the callbacks: one of them may have called stop()
                self._run_callbacks()  # queued by the stop while these ran
                return

    def _run_callbacks(self) -> None:
        """Run the job and partition callbacks queued so far, each once, outside the engine's lock."""
        with self._cond:
            callbacks = list(self._callbacks)
            self._callbacks.clear()
        for cb in callbacks:
            try:
                cb()
            except Exception:  # noqa: BLE001 - a caller's callback must not kill the engine
                log.exception("engine callback failed")

    def _handle_ready(self, ready: list[Any], table: dict[Any, tuple[str, str]]) -> None:
        if self._pipe.r in ready:
            os.read(self._pipe.r, 4096)
        for obj in ready:  # messages first: a dying child's last words come before its death
            if table.get(obj, ("", ""))[1] == "conn":
                self._drain(table[obj][0])
        for obj in ready:
            if table.get(obj, ("", ""))[1] == "sentinel":
                self._on_death(table[obj][0])
        self._check_start_timeouts()
        self._check_stalls()
        if self._state == "running":  # a stopping engine (draining included) restarts nothing
            self.sup.restart_due()
        if self._state in ("running", "draining"):
            self._check_degraded()
            self._dispatch()

    def _drain(self, name: str) -> None:
        handle = self.sup.children[name].handle
        try:
            while not handle.conn.closed and handle.conn.poll():
                self._on_message(name, msg.decode_from_child(handle.conn.recv_bytes()))
        except (EOFError, OSError):
            handle.close()  # the child is gone; its sentinel follows

    def _on_message(self, name: str, m: msg.FromChild) -> None:
        child = self.sup.children[name]
        if isinstance(m, msg.Ready):
            self.sup.on_ready(name, m)
        elif isinstance(m, msg.RingWait):
            self.sched.on_ring_wait(m.task_id, m.waiting)
        elif isinstance(m, msg.Published):
            self.sched.on_published(m.task_id, m.slot, m.timings)
            if child.busy == m.task_id:
                child.busy = None
        elif isinstance(m, msg.Taken):
            self.sched.on_taken(m.task_id, name, child.spec.index)
        elif isinstance(m, msg.ProofDone):
            self._prover_stats(name, child.handle.pid, m.stats)
            public = [int(x) for x in m.public]
            self._apply(self.sched.on_proof(m.task_id, m.proof, public, m.timings, child.spec.index))
        elif isinstance(m, msg.TaskFailed):
            if child.busy == m.task_id:
                child.busy = None
            level = logging.INFO if m.kind == "Cancelled" else logging.WARNING
            task = self.sched.tasks.get(m.task_id)
            where = f" (job {task.job.spec.job_id} partition {task.index})" if task is not None else ""
            log.log(level, "%s: task %d%s failed: %s: %s", name, m.task_id, where, m.kind, m.message)
            self._apply(self.sched.on_failed(m.task_id, m.kind, m.message))
        elif isinstance(m, msg.KeyState):
            self.circuits.on_key_state(name, m)
        elif isinstance(m, msg.Stats):
            self._prover_stats(name, child.handle.pid, m.values)

    def _prover_stats(self, name: str, pid: int, values: dict[str, float]) -> None:
        """Take a prover's figures. Its ``busy_seconds`` counts from 0 in each process, so the figures
        of the process ``pid`` that replaced a dead one of the same name are added to what the earlier
        ones counted: the engine's busy seconds (a Prometheus counter) never go down at a restart."""
        stats = self.provers.setdefault(name, ProverStats())
        seen, before = self._busy_before.get(name, (pid, 0.0))
        if pid != seen:
            before = stats.busy_seconds
        self._busy_before[name] = (pid, before)
        for key in ProverStats.__struct_fields__:
            if key in values:
                setattr(stats, key, float(values[key]))
        if "busy_seconds" in values:
            stats.busy_seconds = before + float(values["busy_seconds"])

    def _on_death(self, name: str) -> None:
        """A child's sentinel fired: reclaim, retry its attempts, schedule its restart."""
        self._drain(name)
        death = self.sup.reap(name)
        if death is None:
            return
        reclaimed = self.ring.reclaim(death.pid)
        if self._state in ("stopping", "stopped"):
            return
        # while draining, a child that exits cleanly was told to stop by someone else (a signal to the
        # whole group): not a crash; nothing is restarted once stop() has begun (the drain finishes with
        # the processes left, within its grace)
        clean = self._state == "draining" and self.sup.children[name].handle.proc.exitcode == 0
        log.log(logging.INFO if clean else logging.ERROR, "%s pid=%d %s (%s); reclaimed %d ring slot(s)", name,
                death.pid, "exited while the engine drains" if clean else "died", death.exit_text, len(reclaimed))
        if death.role == "prover":
            self.circuits.drop_process(name)
        reason = f"{name} (pid {death.pid}) died ({death.exit_text})"
        self._apply(self.sched.on_lost(self._lost_tasks(death, reclaimed), reason))
        if self._state == "starting":
            if self._start_error is None:
                self._start_error = f"{reason} before READY; see its log above"
            return
        if self._state == "running":
            self.sup.schedule_restart(name)

    def _lost_tasks(self, death: Death, reclaimed: list[SlotRecord]) -> list[int]:
        """Attempts the dead child took with it: reclaimed slots, plus what it was working on."""
        lost = {r.task_id for r in reclaimed}
        if death.role == "synth" and death.busy is not None:
            in_ring = {r.task_id: r for r in self.ring.snapshot() if r.state in ("ready", "staging")}
            task = self.sched.tasks.get(death.busy)
            if death.busy in in_ring:  # published just before dying: the slot is good
                self.sched.on_published(death.busy, in_ring[death.busy].slot)
            elif task is not None and task.state == "synthesizing":
                lost.add(death.busy)
        if death.role == "prover":
            lost |= {t.task_id for t in self.sched.in_flight() if t.state == "proving" and t.prover == death.name}
        return sorted(lost)

    def _check_start_timeouts(self) -> None:
        """Kill children that sent no READY within ``start_timeout_s`` (their death is handled as usual)."""
        limit = self.config.start_timeout_s
        for name, child in self.sup.children.items():
            h = child.handle
            if h.ready or h.reaped or not h.proc.is_alive() or time.monotonic() - h.started_at < limit:
                continue
            if child.kill_reason is not None:
                continue  # SIGKILL sent already; its sentinel follows
            child.kill_reason = "killed: no READY in time"
            log.error("[start] %s pid=%d sent no READY within %s: killing it", name, h.pid, self._start_limit())
            if self._state == "starting":
                self._start_error = f"{name} (pid {h.pid}) sent no READY within {self._start_limit()}"
            h.proc.kill()

    def _start_limit(self) -> str:
        """``start_timeout_s`` as its messages give it: the value (``%g``: a limit under a second is not
        "0 s") and the knob that sets it."""
        return f"{self.config.start_timeout_s:g} s (set by {self.key('start_timeout_s')}; raise it if starting is slow)"

    def _check_stalls(self) -> None:
        """Kill a process that has held an attempt longer than ``task_timeout_s`` (synthesizing it,
        or proving it): a hung process never dies by itself, and its partition would wait forever.
        Its death is handled as any other: the attempt is retried, the process restarted."""
        limit, now = self.config.task_timeout_s, time.monotonic()
        for task in self.sched.in_flight():
            holder, held = task.worker if task.state == "synthesizing" else task.prover, task.held_for(now)
            if holder is None or held is None or held < limit:
                continue
            child = self.sup.children.get(holder)
            if child is None or child.kill_reason is not None or child.handle.reaped:
                continue  # gone, or killed already: its sentinel follows
            child.kill_reason = (f"killed: held partition {task.index} of job {task.job.spec.job_id} for "
                                 f"{held:.0f} s, more than task_timeout ({limit:g} s)")
            log.error("%s pid=%d %s", holder, child.handle.pid, child.kill_reason)
            child.handle.proc.kill()

    def _check_degraded(self) -> None:
        """Report a role that keeps dying, and fail the jobs that cannot progress while it does."""
        degraded = self.sup.degraded()
        if [d.role for d in degraded] != [d.role for d in self._degraded]:
            for d in degraded:
                log.error("[degraded] %s", d.reason)
            if not degraded:
                log.warning("[recovered] every role has a live process again")
        self._degraded = degraded
        if degraded and self.sched.jobs:
            cause = "; ".join(d.reason for d in degraded)
            self._apply(self.sched.fail_all(f"the engine is degraded: {cause}", kind="WorkerDied"))

    def _dispatch(self) -> None:
        """Hand queued partitions to idle synthesis workers (running, or draining for started jobs)."""
        for child in self.sup.ready("synth"):
            if child.busy is not None:
                continue
            task = self.sched.next_task(started_only=self._state == "draining")
            if task is None:
                return
            self._send_task(child.spec.name, task)

    def _send_task(self, name: str, task: Task) -> None:
        child = self.sup.children[name]
        p = task.job.spec.partitions[task.index]
        child.busy, task.worker = task.task_id, name
        child.handle.send(msg.SynthTask(
            task.task_id, task.job.spec.job_id, task.job.seq, task.index, int(task.job.spec.priority),
            task.attempt, task.job.circuit, p.kind, p.data, p.seed, task.job.submitted_mono,
            task.t_dispatch or 0.0))

    def _apply(self, out: Outcome) -> None:
        """Queue callbacks; drop cancelled attempts from the ring and tell the children."""
        if out.cancel:
            ids = [t.task_id for t in out.cancel]
            self.ring.drop_ready(set(ids))
            self.sup.broadcast(msg.CancelTasks(ids))
        on_partition, on_job = self.on_partition_done, self.on_job_done
        if on_partition is not None:
            for job_id, result in out.partitions:
                self._callbacks.append(functools.partial(on_partition, job_id, result))
        if on_job is not None:
            for jr in out.jobs:
                self._callbacks.append(functools.partial(on_job, jr))
        for job in out.check_key:
            self._key_checks_due[job.spec.job_id] = (time.monotonic() + KEY_CHECK_WAIT_S, job.circuit)
            checks = self._key_checks.get(job.circuit.zkey)
            if checks is None:
                checks = self._key_checks[job.circuit.zkey] = SerialThread(f"cuzk-key-check-{job.spec.circuit_id}")
            checks.call_soon(functools.partial(self._check_key, job.spec.job_id, job.circuit))
        self._cond.notify_all()

    def _check_key(self, job_id: str, ref: msg.CircuitRef) -> None:
        """On the key file's own daemon thread (its jobs end in the order their last proofs came): read it
        again after a job's last proof, then end the job (:meth:`.scheduler.Scheduler.on_key_checked`).
        Under the engine's lock, on a key whose mount hangs, that read stopped the event thread (every
        child's messages and deaths, the hung-task timer), the status, every other job and the engine's
        stop for ever; here it holds that key's jobs alone, which the stop's drain gives up after its grace."""
        try:
            changed = key_changed(ref)
        except Exception as e:  # noqa: BLE001 - never leave the job waiting: it fails, naming why
            changed = f"zkey {ref.zkey} could not be read again after the job's last proof: {e}"
        with self._cond:
            self._key_checks_due.pop(job_id, None)
            self._apply(self.sched.on_key_checked(job_id, changed))
        self._wake()

    def _give_up_key_checks(self) -> None:
        """Under the lock, on the event thread: a job whose key file's read after its last proof has not
        returned within KEY_CHECK_WAIT_S fails, naming the file (its storage hangs: a hard mount whose server
        is gone); its waiters get an answer, and the read, which goes on, finds the job ended."""
        now = time.monotonic()
        for job_id, (due, ref) in list(self._key_checks_due.items()):
            if due <= now:
                del self._key_checks_due[job_id]
                log.error("job %s: zkey %s did not answer within %g s when read again after the job's last proof; "
                          "the job fails", job_id, ref.zkey, KEY_CHECK_WAIT_S)
                self._apply(self.sched.on_key_checked(
                    job_id, f"zkey {ref.zkey} did not answer within {KEY_CHECK_WAIT_S:g} s when read again after "
                    "the job's last proof (its storage hangs?): its proofs cannot be confirmed as that key's; "
                    "send the job again", kind="ResourceError"))


class WakePipe:
    """The event thread's wake-up pipe. A wake after the engine has stopped (a cancel or a status
    call from another thread, late) is a no-op: once closed, the descriptors' numbers may already
    belong to another file of the process, which a stray write would corrupt."""

    def __init__(self) -> None:
        self.r, self._w = os.pipe()
        os.set_blocking(self._w, False)  # a full pipe (the thread is awake anyway) never blocks a waker
        self._lock = threading.Lock()
        self._closed = False

    def wake(self) -> None:
        """One byte for the event thread's wait (the pipe full: it is awake anyway)."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    os.write(self._w, b"x")

    def close(self) -> None:
        """Close both ends, once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self.r, self._w):
                with contextlib.suppress(OSError):
                    os.close(fd)
