"""The engine: the pipeline's one public entry point (its contract is docs/engine.md).

Two objects, one per phase of an engine's life:

* :class:`Engine`, configured but not running: it validates the config, claims the
  IPC name prefix and knows the circuits (``register_circuit`` may run a synthetic
  circuit's dev setup before any process exists). :meth:`Engine.start` creates the
  ring, spawns the children, waits for every READY (``start_timeout_s``) and returns
  a :class:`RunningEngine`; if anything fails it removes what it made and raises.
* :class:`RunningEngine` holds the slot ring of this engine (every shm segment and
  semaphore named ``<prefix>-...``), the :class:`~.supervisor.Supervisor` of the
  child processes, the :class:`~.scheduler.Scheduler` of jobs, the
  :class:`~.circuits.CircuitTable`, and one event thread, ``cuzk-engine-events``,
  that does all the work: it waits on every child's pipe and process sentinel
  (plus a wake-up pipe for the caller's threads), handles messages, notices deaths,
  restarts children when their backoff is over, dispatches partitions to idle
  synthesis workers and runs the callbacks. Callers' threads only change state
  under the lock and wake it. A second thread, ``cuzk-engine-memory``, reads the
  process tree's memory once a second, so a status poll never waits on /proc, and
  trims the ring: the segments of slots idle for ``TRIM_IDLE_S`` go back to the system.

Lifecycle of a running engine: starting -> running -> draining (``stop``: no new
jobs start, started jobs may finish until the grace runs out) -> stopping ->
stopped (children stopped: message, a wait (10 s, 1 s where the stop has no grace), SIGTERM, 5 s,
SIGKILL; every named IPC object with the prefix unlinked). ``stop`` is idempotent; a ``weakref.finalize`` removes
the shm objects even if ``stop`` is never called. Once ``stop`` has begun no child is
restarted (a drain finishes with the processes left), and a stop that an interrupt ends
part way (a second Ctrl-C) kills every child at once rather than leave them to a live
event thread that would take their exits for crashes.

A SIGKILL of the engine leaves no ring behind at any point of its stop. While a child
runs, the child removes the ring if the engine dies (:mod:`.procs`, its death pipe); once
the last child is gone, nobody would. So the names go first, in the one step where
nothing needs them any more and a child still runs: ``stop`` first stops the children
that may still open a name (the synthesis workers, which make slot segments by name,
and any child not READY, which may not have attached yet), then unlinks every name of
the ring, and only then stops the provers. A READY prover has attached, and opens a
name only to map the segment of a slot it takes: one left READY (a failed job's) that
it has not mapped yet is given up as cancelled. Processes that have an object open or
mapped keep it; the engine's own handles go with the ring's destroy at the very end.
The names cannot go sooner: a producer makes each slot's segment by name whenever the
slot is first used or resized (and again after a trim), and a restarted child attaches
by name, for as long as the engine runs. Where no READY prover runs at that step (all
dead, waiting for their restart), the names go right after the last child has left,
which leaves the moment between the two. A ring left that way, or by an engine killed
with its children (a SIGKILL to the process group), goes with the next engine's start
of this user or ``cuzk-mp shm clean`` (:mod:`.shm_names`). An interrupted stop unlinks
the names once it has sent every child SIGKILL.

Faults: when a child dies, its ring slots (FILLING/STAGING) are reclaimed, the
partitions it held are retried (up to ``max_attempts`` in all, then the job fails
with an error naming the process and its exit code), and the process is restarted
(with backoff when it keeps dying). While a role has no live process and keeps
dying, the engine is *degraded*: :meth:`RunningEngine.status` says which role and
why, and every job that cannot progress fails with that cause. Other jobs carry on.

The event thread's work, the order of a death's handling included, is :mod:`.engine_events`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import weakref
from collections import deque
from collections.abc import Callable

import msgspec

from ..errors import ConfigError, CuzkError, InputError, ResourceError, WorkerDied, error_from_kind
from . import messages as msg
from .circuits import CircuitTable
from .engine_events import EngineEvents, WakePipe
from .serial import SerialThread
from .monitor import host_bytes, tree_memory
from .ring import TRIM_IDLE_S, Ring, RingStats, SlotRecord
from .shm_names import live_segments, remove_abandoned, shm_bytes
from .scheduler import Scheduler
from .status import EngineMetrics, EngineStatus, MemoryStatus, ProverStats, RingStatus
from .supervisor import NO_GRACE_STOP_WAIT_S, ROLES, STOP_WAIT_S, Degraded, Supervisor, child_specs
from .types import CircuitSpec, EngineConfig, JobResult, JobSpec, PartitionResult, field_key

log = logging.getLogger("cuzk_mp.pipeline.engine")
MEMORY_REFRESH_S = 1.0  # the tree's memory is read from /proc this often, off the callers' path
_LIVE_PREFIXES: set[str] = set()  # prefixes of this process's engines not yet stopped (one ring per prefix)
_LIVE_LOCK = threading.Lock()

JobCallback = Callable[[JobResult], None]
PartitionCallback = Callable[[str, PartitionResult], None]


class Engine:
    """A configured engine (not running yet): config, IPC prefix, circuits. ``start()`` runs it."""

    def __init__(self, config: EngineConfig, on_job_done: JobCallback | None = None,
                 on_partition_done: PartitionCallback | None = None,
                 key: Callable[[str], str] = field_key()) -> None:
        """``key`` turns a config field's name into the name its caller sets it by (the bench passes its
        options, as :meth:`EngineConfig.validate` takes): the engine's messages about a limit (no READY
        within ``start_timeout_s``) point the reader at what they can change."""
        config.validate(key)
        self.config = config
        self.key = key
        self.prefix = config.prefix()
        with _LIVE_LOCK:
            if self.prefix in _LIVE_PREFIXES:
                raise ConfigError(f"an engine with shm prefix {self.prefix} is already live in this process: "
                                  "give each engine its own EngineConfig.shm_prefix")
            _LIVE_PREFIXES.add(self.prefix)
        self.on_job_done = on_job_done
        self.on_partition_done = on_partition_done
        self.circuits = CircuitTable(config.param_cache, config.backend)
        self.state = "created"  # created | starting | started | failed | stopped
        self._finalizer = weakref.finalize(self, _release_prefix, self.prefix)

    def register_circuit(self, spec: CircuitSpec) -> None:
        """Validate and record a circuit (synthetic: make its dev key once, cached in ``param_cache``)."""
        self.circuits.refs[spec.circuit_id] = self.circuits.make_ref(spec)

    def start(self) -> RunningEngine:
        """Create the ring, spawn the children, wait for every READY; the running engine.

        Raises WorkerDied (naming the child and why) if a child dies or stays silent
        before READY; nothing is left behind, and the prefix is free again.
        """
        from ..backends import gpu_unavailable_reason, resolve_backend_name

        if self.state != "created":
            raise CuzkError(f"engine {self.prefix}: start() called in state {self.state}")
        self.state = "starting"
        try:
            backend = resolve_backend_name(self.config.backend)
            why = gpu_unavailable_reason(probe_device=False) if backend == "gpu" else None
            if why is not None:
                raise InputError(f"backend gpu: {why}")
            devices = list(self.config.devices) if self.config.devices is not None else _default_devices(backend)
            ring = Ring.create(self.prefix, self.config.ring_slots)
            try:
                sup = Supervisor.start(child_specs(self.config, ring.handle, backend, devices))
            except BaseException:
                ring.destroy()
                raise
        except BaseException:
            self.state = "failed"
            self._finalizer()
            raise
        self._finalizer.detach()  # the running engine owns the prefix from here
        running = RunningEngine(self, ring, sup, backend, devices)
        try:
            running.wait_ready()
        except BaseException:
            self.state = "failed"
            raise
        self.state = "started"
        return running

    def stop(self) -> None:
        """Give the prefix back without starting (idempotent; a started engine is stopped by its
        :class:`RunningEngine`). It does nothing while :meth:`start` runs: that start is ended by an
        interrupt of its thread (or its ``start_timeout_s``), which stops what it started."""
        if self.state == "created":
            self.state = "stopped"
            self._finalizer()


class RunningEngine(EngineEvents):
    """Multiprocess Groth16 proving: synthesis workers -> slot ring -> one prover process per device."""

    def __init__(self, engine: Engine, ring: Ring, sup: Supervisor, backend: str, devices: list[int]) -> None:
        self.config = engine.config
        self.key = engine.key
        self.prefix = engine.prefix
        self.backend = backend
        self.devices = devices
        self.ring = ring
        self.sup = sup
        self.circuits = engine.circuits
        self.sched = Scheduler(self.config.max_attempts)
        self.on_job_done = engine.on_job_done
        self.on_partition_done = engine.on_partition_done
        self.provers: dict[str, ProverStats] = {}
        self._busy_before: dict[str, tuple[int, float]] = {}
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._state = "starting"
        self._start_error: str | None = None
        self._degraded: list[Degraded] = []
        self._callbacks: deque[Callable[[], None]] = deque()
        self._memory_last: MemoryStatus | None = None
        self._memory_stop = threading.Event()
        self._stopped = threading.Event()  # set when stop() has ended (a second caller waits for it)
        self._abandoned = False  # an interrupt ended stop() part way: the event thread finishes it
        self._ring_lock = threading.Lock()  # status reads of the ring against its destroy
        self._pipe = WakePipe()
        self._key_checks: dict[str, SerialThread] = {}
        self._key_checks_due: dict[str, tuple[float, msg.CircuitRef]] = {}
        self._finalizer = weakref.finalize(self, _release_ipc, self.prefix, self._pipe)
        self._thread = threading.Thread(target=self._loop, name="cuzk-engine-events", daemon=True)
        self._thread.start()
        self._memory_thread = threading.Thread(target=self._watch_memory, name="cuzk-engine-memory", daemon=True)
        self._memory_thread.start()

    @property
    def state(self) -> str:
        """starting | running | draining | stopping | stopped."""
        return self._state

    def wait_ready(self) -> None:
        """Block until every child is READY (then state running); on failure stop and raise WorkerDied."""
        limit = self.config.start_timeout_s
        try:
            with self._cond:
                ok = self._cond.wait_for(lambda: self._start_error is not None or self.sup.all_ready(),
                                         timeout=limit)
                error = self._start_error or (None if ok else f"children not READY within {self._start_limit()}")
                if error is None:
                    self._state = "running"
                    log.info("[start] engine %s running: %s backend, devices %s, %d synthesis workers x %d threads, "
                             "%d slots", self.prefix, self.backend, self.devices, self.config.partition_workers,
                             self.config.threads_per_partition(len(self.devices) if self.backend == "cpu" else 0),
                             self.config.ring_slots)
                    return
        except BaseException:  # an interrupt (or any failure of the wait): the children go too
            self.stop(grace_s=0)
            raise
        self.stop(grace_s=0)
        raise WorkerDied(f"engine {self.prefix} failed to start: {error}")

    def stop(self, grace_s: float = 30.0) -> None:
        """Drain (started jobs may finish within ``grace_s``), stop the children, unlink every IPC object.

        The first call does it; a call while it runs waits for it to end. Called from an engine
        callback (the event thread, which a drain needs), the drain has no grace."""
        with self._cond:
            if self._state in ("draining", "stopping", "stopped"):
                owner = False
            else:
                owner, self._state = True, "draining"
        if not owner:
            if threading.current_thread() is not self._thread:
                self._stopped.wait()
            return
        if threading.current_thread() is self._thread and grace_s > 0:
            log.warning("[shutdown] engine %s: stop() from an engine callback: no drain grace (the drain "
                        "needs the thread that runs the callbacks)", self.prefix)
            grace_s = 0.0
        try:
            self._stop(grace_s)
        except BaseException:
            self._abandon()
            raise
        finally:
            self._stopped.set()

    def _abandon(self) -> None:
        """The stop ended part way (an interrupt: a second Ctrl-C while a first one's stop runs). What
        must not stay half done is done at once, without waiting: the engine is ``stopping`` (from here
        no death is handled as a crash and no child is restarted: a restarted child would outlive the
        process that gave up on it) and every child is sent SIGKILL. The ring's names are unlinked then
        (no child opens one any more; the module docstring says why now); what a dying child makes
        after that, and the engine's handles, go with the engine's event thread once it has seen every
        child go (:meth:`_finish_abandoned`), or with the engine's finalizer at exit. A stop
        interrupted once it had stopped every child (the engine ``stopped``: its event thread ends by
        itself) stays ``stopped``: what is left of it, the pipes and the ring, is done here once that
        thread has ended, as nothing else would do it."""
        if self._state == "stopped":
            if self._thread is not threading.current_thread():
                self._thread.join(30.0)  # told already: it ends within a poll, or once a callback returns
            self._finish_abandoned()
            return
        self._state = "stopping"  # one store, first: a further interrupt cannot undo it
        self._abandoned = True
        self._memory_stop.set()
        self._kill_children()
        self.ring.unlink()
        self._wake()

    def _kill_children(self) -> None:
        """SIGKILL every child not reaped yet, and no restart after: an abandoned stop's. The event thread
        repeats it until none is alive (a restart it was making while the stop was abandoned, its state
        read as ``running`` just before, is killed on its next round)."""
        for child in list(self.sup.children.values()):
            child.restart_at = None
            if not child.handle.reaped:
                with contextlib.suppress(OSError):
                    child.handle.proc.kill()

    def _finish_abandoned(self) -> None:
        """The rest of a stop an interrupt ended (:meth:`_abandon`), run by the event thread once no child
        is alive: the pipes closed, the ring and every IPC object removed, the state ``stopped`` (which
        ends the event thread)."""
        if self._memory_thread is not threading.current_thread():
            self._memory_thread.join(10.0)  # it trims the ring: done before the ring goes
        removed = self._remove_ipc()
        with self._cond:
            self._state = "stopped"
        log.info("[shutdown] engine %s stopped (its stop was interrupted%s); removed %d IPC objects", self.prefix,
                 ": the children were killed" if self._abandoned else "", removed)

    def _remove_ipc(self) -> int:
        """The end of every stop: the children's pipes closed, the ring and every IPC object of the prefix
        removed, the wake-up pipe closed (the finalizer's work, done now); how many objects were removed."""
        self.sup.close_all()
        for checks in self._key_checks.values():  # a read stuck on a dead mount ends with its thread alone
            checks.close(0.0)
        with self._ring_lock:
            left = self.ring.destroy()
        self._finalizer()
        return len(left)

    def _stop(self, grace_s: float) -> None:
        with self._cond:
            self._apply(self.sched.fail_all_unstarted("engine stopping: the job had not started"))
            if self.sched.jobs and grace_s > 0:
                log.info("[shutdown] engine %s draining: %d started job(s) may finish within %.1f s", self.prefix,
                         len(self.sched.jobs), grace_s)
            elif self.sched.jobs:
                log.info("[shutdown] engine %s stopping: %d started job(s) end unfinished (no drain grace)",
                         self.prefix, len(self.sched.jobs))
            else:
                log.info("[shutdown] engine %s stopping: no job in flight", self.prefix)
            self._wake()
            self._cond.wait_for(lambda: not self.sched.jobs, timeout=grace_s)
            self._apply(self.sched.fail_all("engine stopped before the job finished"))
            self._state = "stopping"
            self._wake()
        # the ring's names go while a child that would remove them at the engine's death still runs:
        # the module docstring says why in this order. Without grace (an interrupted bench) a child gets
        # SIGTERM soon after the stop message: one loading a key reads it only once the load ends
        wait_s = STOP_WAIT_S if grace_s > 0 else NO_GRACE_STOP_WAIT_S
        self.sup.stop_all(wait_s, only=lambda c: c.spec.role != "prover" or not c.handle.ready)
        unlinked = len(self.ring.unlink())
        self.sup.stop_all(wait_s)
        self._memory_stop.set()
        if self._memory_thread is not threading.current_thread():
            self._memory_thread.join(10.0)  # it trims the ring: done before the ring goes
        with self._cond:
            self._state = "stopped"
            self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(30.0)
        log.info("[shutdown] engine %s stopped; removed %d IPC objects", self.prefix, unlinked + self._remove_ipc())
        self._run_callbacks()  # what the event thread left (it ends once stopped): the failed jobs' callbacks

    # ---- circuits and keys
    def register_circuit(self, spec: CircuitSpec) -> None:
        """Validate and record a circuit (synthetic: its dev key is made once, in ``param_cache``)."""
        ref = self.circuits.make_ref(spec)
        with self._lock:
            old = self.circuits.refs.get(spec.circuit_id)
            if old is not None and old != ref and self.sched.uses_circuit(spec.circuit_id):
                raise InputError(f"circuit {spec.circuit_id}: re-registered with other files while jobs use it")
            self.circuits.refs[spec.circuit_id] = ref

    def preload(self, circuit_id: str) -> None:
        """Load the key into every prover process (GPU: resident on the device); blocks until done."""
        with self._lock:
            ref = self.circuits.ref(circuit_id)
        ref = self.circuits.pin(ref)  # the key a job accepted now is proved with: read outside the lock
        with self._cond:
            if self._state != "running":
                raise CuzkError(f"engine {self.prefix}: preload needs a running engine (state {self._state})")
            asked = {c.spec.name: c.handle.pid for c in self.sup.ready("prover")}
            provers = list(asked)

            def gone() -> list[str]:  # asked, and died since (a restart under the same name was not asked)
                return [name for name, pid in asked.items()
                        if self.sup.children[name].handle.pid != pid or self.sup.children[name].handle.reaped]

            self.circuits.forget(circuit_id, provers)
            self.sup.broadcast(msg.LoadKey(ref), role="prover")
            done = self._cond.wait_for(lambda: self.circuits.reported(circuit_id, provers) or bool(gone()),
                                       timeout=self.config.start_timeout_s)
            errors = self.circuits.errors(circuit_id, provers)
            dead = gone()
        if errors:  # the class of the first failure: a bad key file is the input's, no room is exit 4
            raise error_from_kind(errors[0][1], f"preload {circuit_id}: " + "; ".join(text for text, _ in errors))
        if dead:
            raise WorkerDied(f"preload {circuit_id}: {', '.join(dead)} died while loading the key (it is "
                             "restarted; a job loads the key when it needs it, or preload again)")
        if not done:
            raise ResourceError(f"preload {circuit_id}: not loaded within {self._start_limit()}")

    def evict(self, circuit_id: str) -> bool:
        """Drop the key from the prover processes; False (nothing done) if a job still uses it."""
        with self._lock:
            self.circuits.ref(circuit_id)
            if self.sched.uses_circuit(circuit_id):
                return False
            self.sup.broadcast(msg.EvictKey(circuit_id), role="prover")
            return True

    # ---- jobs
    def submit(self, job: JobSpec) -> None:
        """Queue a job (never blocks on the ring). The one validation of its inputs happens here:
        InputError naming the job, the partition and what is wrong."""
        with self._lock:
            self._accepting()
        ref = self.circuits.check_job(job)  # reads the key file's header: outside the lock, which a key on
        with self._lock:  # a hard mount whose server is gone would hold for ever
            self._accepting()
            if job.job_id in self.sched.jobs:
                raise InputError(f"job {job.job_id} is already queued or running")
            self.sched.add_job(job, ref)
            self._wake()

    def _accepting(self) -> None:
        if self._state != "running":
            raise CuzkError(f"engine {self.prefix} is {self._state}: not accepting jobs")

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: queued partitions dropped, running ones stop at their next boundary."""
        with self._lock:
            out = self.sched.cancel(job_id)
            if out is None:
                return False
            self._apply(out)
            self._wake()
            return True

    # ---- status
    def degraded(self) -> list[Degraded]:
        """The roles that have no live process and keep dying (empty when healthy)."""
        with self._lock:
            return list(self._degraded)

    def status(self) -> EngineStatus:
        """A typed snapshot: jobs, processes, ring, resident keys, memory (docs/engine.md, "Status")."""
        ring = RingStatus(*self._ring_view())  # outside the engine's lock: see _ring_view
        with self._lock:
            state, degraded, queue, jobs = self._state, list(self._degraded), self.sched.queue(), self.sched.rows()
            processes, srs, device = self.sup.rows(), self.circuits.rows(), self._prover_snapshot()
        memory = msgspec.structs.replace(self._memory(), device=device)
        return EngineStatus(state=state, prefix=self.prefix, backend=self.backend, devices=list(self.devices),
                            degraded=degraded, queue=queue, jobs=jobs, processes=processes, ring=ring, srs=srs,
                            memory=memory)

    def _memory(self) -> MemoryStatus:
        """The tree's memory as the ``cuzk-engine-memory`` thread last read it (read now if never)."""
        return self._memory_last or self._read_memory()

    def _read_memory(self) -> MemoryStatus:
        """Read the tree's memory (monitor accounting). smaps_rollup walks every mapping of a process,
        so this runs on its own thread every ``MEMORY_REFRESH_S``, not on every status poll."""
        tree, shm = tree_memory(), shm_bytes(self.prefix)
        memory = MemoryStatus(host_bytes=host_bytes(tree, shm), host_pss_bytes=sum(m.pss for m in tree),
                              host_rss_bytes=sum(m.rss for m in tree), shm_bytes=shm,
                              live_segments=live_segments(self.prefix), processes=tree, device={})
        self._memory_last = memory
        return memory

    def _watch_memory(self) -> None:
        while not self._memory_stop.wait(MEMORY_REFRESH_S):
            try:
                self._trim_ring()
                self._read_memory()
            except Exception:  # noqa: BLE001 - a failed read must not end the refreshes
                log.exception("reading the process tree's memory or trimming the ring failed")

    def _trim_ring(self) -> None:
        """Give the segments of slots idle for ``TRIM_IDLE_S`` back to the system (docs/ring.md)."""
        before = shm_bytes(self.prefix)
        trimmed = self.ring.trim(TRIM_IDLE_S)
        if trimmed:
            log.info("ring %s idle: trimmed the segments of slot(s) %s (%.2f GiB returned)", self.prefix,
                     trimmed, (before - shm_bytes(self.prefix)) / 2**30)

    def metrics(self) -> EngineMetrics:
        """Counters and gauges (docs/engine.md, "Metrics")."""
        _, stats = self._ring_view()  # outside the engine's lock: see _ring_view
        with self._lock:
            children = self.sup.children.values()
            return EngineMetrics(
                state=self._state, counters=self.sched.counters(), queue=self.sched.queue(),
                jobs_active=len(self.sched.jobs),
                restarts={r: sum(c.restarts for c in children if c.spec.role == r) for r in ROLES},
                alive={r: len(self.sup.live(r)) for r in ROLES}, degraded=list(self._degraded), ring=stats,
                shm_bytes=shm_bytes(self.prefix),
                provers=self._prover_snapshot())

    def _prover_snapshot(self) -> dict[str, ProverStats]:
        return {name: msgspec.structs.replace(stats) for name, stats in self.provers.items()}

    def _ring_view(self) -> tuple[list[SlotRecord], RingStats]:
        """The ring's records and counters. Read under the ring's own lock, which a child stopped inside
        it (SIGSTOP) holds until it is killed: never while holding the engine's lock, which the event
        thread that would kill it needs. ``_ring_lock`` keeps the read apart from the ring's destroy."""
        with self._ring_lock:
            if self.ring.closed:
                return [], self.ring.stats()  # the counters it had when it closed
            return self.ring.snapshot(), self.ring.stats()


def _default_devices(backend: str) -> list[int]:
    """CPU: one prover process. GPU: every visible GPU, as physical ids (what CUDA_VISIBLE_DEVICES takes)."""
    return [0] if backend == "cpu" else visible_gpus()


def visible_gpus() -> list[int]:
    """Physical ids of the GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU.

    The count comes from ``nvidia-smi -L`` so that the engine process never
    initialises CUDA itself (its prover processes own the GPUs).
    """
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        ids = [x.strip() for x in mask.split(",") if x.strip()]
        if not all(x.isdigit() for x in ids):
            raise InputError(f"CUDA_VISIBLE_DEVICES={mask!r} is not a list of GPU numbers: set EngineConfig.devices")
        return [int(x) for x in ids]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ResourceError(f"cannot list GPUs with nvidia-smi ({exc}): set EngineConfig.devices") from exc
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if count == 0:
        raise ResourceError("nvidia-smi lists no GPU: use the cpu backend")
    return list(range(count))


def _release_prefix(prefix: str) -> None:
    """Finalizer of a configured engine: unlink what this process (or a dead one) left with the
    prefix and free it; a live process's ring of the same prefix stays (:func:`.shm_names.remove_abandoned`)."""
    remove_abandoned(prefix)
    with _LIVE_LOCK:
        _LIVE_PREFIXES.discard(prefix)

def _release_ipc(prefix: str, pipe: WakePipe) -> None:
    """Finalizer of a running engine: unlink every IPC object of the prefix, close the wake-up pipe, free it."""
    _release_prefix(prefix)
    pipe.close()
