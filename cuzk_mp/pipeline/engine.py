"""The Engine: the pipeline's one public entry point (contract: /work/briefs/engine_api.md).

Owns: the slot ring of this engine (every shm segment and semaphore named
``<prefix>-...``), the child processes (through the :class:`Supervisor`), the
job bookkeeping (through the :class:`Scheduler`) and one event thread,
``cuzk-engine-events``, that does all the work: it waits on every child's pipe
and process sentinel (plus a wake-up pipe for the caller's threads), handles
messages, notices deaths, dispatches partitions to idle synthesis workers and
runs the callbacks. Callers' threads only change state under the lock and wake it.

Lifecycle: created -> starting (READY handshake, ``start_timeout_s``) -> running
-> draining (``stop``: no new jobs start, started jobs may finish until the
grace runs out) -> stopped (children stopped: message, SIGTERM, 5 s, SIGKILL;
every named IPC object with the prefix unlinked). ``stop`` is idempotent; a
``weakref.finalize`` removes the shm objects even if ``stop`` is never called.

Faults: when a child dies, its ring slots (FILLING/STAGING) are reclaimed, the
partitions it held are retried (up to ``max_attempts`` in all, then the job
fails with an error naming the process and its exit code), and the process is
restarted (up to 3 consecutive deaths before READY). Other jobs carry on.

Additions to the contract (documented here, as the contract asks):
``Engine.state`` (property), ``Engine.prefix``, ``Engine.devices``,
``Engine.backend``; status() adds "state", "prefix", "backend", "queue"; and
metrics() returns ``{"counters": {...}, "gauges": {...}, "histograms":
{"stage_seconds": {stage: histogram}}}`` (see :class:`~.monitor.Histogram`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

from ..errors import ConfigError, CuzkError, InputError, ResourceError, WorkerDied
from . import messages as msg
from .engine_views import engine_metrics, engine_status
from .ring import Ring, cleanup_stale
from .scheduler import Outcome, Scheduler, Task
from .supervisor import Supervisor, child_specs
from .types import INPUT_KINDS, SYNTHETIC_KINDS, CircuitSpec, EngineConfig, JobResult, JobSpec, PartitionResult

log = logging.getLogger("cuzk_mp.pipeline.engine")
POLL_S = 0.5
_LIVE_PREFIXES: set[str] = set()  # prefixes of this process's engines not yet stopped (one ring per prefix)
_LIVE_LOCK = threading.Lock()


class Engine:
    """Multiprocess Groth16 proving: synthesis workers -> slot ring -> one prover process per device."""

    def __init__(self, config: EngineConfig, on_job_done: Callable[[JobResult], None] | None = None,
                 on_partition_done: Callable[[str, PartitionResult], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.prefix = config.prefix()
        with _LIVE_LOCK:
            if self.prefix in _LIVE_PREFIXES:
                raise ConfigError(f"an engine with shm prefix {self.prefix} is already live in this process: "
                                  "give each engine its own EngineConfig.shm_prefix")
            _LIVE_PREFIXES.add(self.prefix)
        self.on_job_done = on_job_done
        self.on_partition_done = on_partition_done
        self.backend = ""
        self.devices: list[int] = []
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._state = "created"
        self._start_error: str | None = None
        self._circuits: dict[str, CircuitSpec] = {}
        self._refs: dict[str, msg.CircuitRef] = {}
        self.sched = Scheduler(config.max_attempts)
        self.ring: Ring | None = None
        self.sup: Supervisor | None = None
        self._thread: threading.Thread | None = None
        self._callbacks: deque[Callable[[], None]] = deque()
        self.srs: dict[tuple[str, str], msg.KeyState] = {}
        self.child_stats: dict[str, dict[str, float]] = {}
        self.stage_hist: dict[str, object] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._finalizer = weakref.finalize(self, _release_ipc, self.prefix, self._wake_r, self._wake_w)

    @property
    def state(self) -> str:
        """created | starting | running | draining | stopped | failed."""
        return self._state

    # ---- lifecycle
    def start(self) -> None:
        """Create the ring, spawn the children, wait for every READY (``start_timeout_s``)."""
        from ..backends import resolve_backend_name

        with self._lock:
            if self._state != "created":
                raise CuzkError(f"engine {self.prefix}: start() called in state {self._state}")
            self._state = "starting"
        try:
            self.backend = resolve_backend_name(self.config.backend)
            self.devices = list(self.config.devices) if self.config.devices is not None else self._default_devices()
            self.ring = Ring.create(self.prefix, self.config.ring_slots)
            self.sup = Supervisor(child_specs(self.config, self.ring.handle, self.backend, self.devices))
            self.sup.spawn_all()
            self._thread = threading.Thread(target=self._loop, name="cuzk-engine-events", daemon=True)
            self._thread.start()
        except BaseException:
            self.stop(grace_s=0)  # whatever was created goes again
            self._state = "failed"
            raise
        with self._cond:
            ok = self._cond.wait_for(lambda: self._start_error is not None or self._all_ready(),
                                     timeout=self.config.start_timeout_s)
            error = self._start_error or (None if ok else
                                          f"children not READY within {self.config.start_timeout_s} s")
            if error is None:
                self._state = "running"
                log.info("[start] engine %s running: %s backend, devices %s, %d synthesis workers, %d slots",
                         self.prefix, self.backend, self.devices, self.config.partition_workers,
                         self.config.ring_slots)
                return
        self.stop(grace_s=0)
        self._state = "failed"
        raise WorkerDied(f"engine {self.prefix} failed to start: {error}")

    def _default_devices(self) -> list[int]:
        """CPU: one prover process. GPU: every visible GPU, as physical ids (what CUDA_VISIBLE_DEVICES takes)."""
        if self.backend == "cpu":
            return [0]
        return visible_gpus()

    def _all_ready(self) -> bool:
        assert self.sup is not None
        return all(s.handle is not None and s.handle.ready for s in self.sup.slots.values())

    def stop(self, grace_s: float = 30.0) -> None:
        """Drain (started jobs may finish within ``grace_s``), stop the children, unlink every IPC object."""
        with self._cond:
            if self._state in ("stopped", "failed"):
                return
            if self._state == "created":
                self._state = "stopped"
                self._finalizer()
                return
            self._state = "draining"
            log.info("[shutdown] engine %s draining (grace %.1f s)", self.prefix, grace_s)
            self._apply(self.sched.fail_all_unstarted("engine stopping: the job had not started"))
            self._wake()
            self._cond.wait_for(lambda: not self.sched.jobs, timeout=grace_s)
            self._apply(self.sched.fail_all("engine stopped before the job finished"))
            self._state = "stopping"
            self._wake()
        if self.sup is not None:
            self.sup.stop_all()
        with self._cond:
            self._state = "stopped"
            self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30.0)
        if self.sup is not None:
            self.sup.close_all()
        if self.ring is not None:
            left = self.ring.destroy()
            log.info("[shutdown] engine %s stopped; removed %d IPC objects", self.prefix, len(left))
        self._finalizer()

    # ---- circuits and keys
    def register_circuit(self, spec: CircuitSpec) -> None:
        """Validate and record a circuit (synthetic: make its dev key once, cached in ``param_cache``)."""
        ref = self._circuit_ref(spec)
        with self._lock:
            old = self._refs.get(spec.circuit_id)
            if old is not None and old != ref and self.sched.uses_circuit(spec.circuit_id):
                raise InputError(f"circuit {spec.circuit_id}: re-registered with other files while jobs use it")
            self._circuits[spec.circuit_id], self._refs[spec.circuit_id] = spec, ref

    def _circuit_ref(self, spec: CircuitSpec) -> msg.CircuitRef:
        cid = spec.circuit_id
        if not cid or spec.partitions < 1:
            raise InputError(f"circuit {cid!r}: needs a non-empty id and partitions >= 1 (got {spec.partitions})")
        if spec.synthetic is not None:
            if spec.synthetic not in SYNTHETIC_KINDS or spec.log_n is None:
                raise InputError(f"circuit {cid}: synthetic must be one of {SYNTHETIC_KINDS} with log_n set")
            from .keys import ensure_synthetic_key

            zkey, r1cs = ensure_synthetic_key(spec.synthetic, spec.log_n, self.config.param_cache, self.config.backend)
            return msg.CircuitRef(cid, str(zkey), str(r1cs), None, spec.synthetic, spec.log_n)
        for what, path, required in (("zkey", spec.zkey, True), ("r1cs", spec.r1cs, True), ("wasm", spec.wasm, False)):
            if path is None and required:
                raise InputError(f"circuit {cid}: {what} is required for a circom circuit")
            if path is not None and not Path(path).is_file():
                raise InputError(f"circuit {cid}: {what} file {path} does not exist")
        return msg.CircuitRef(cid, str(Path(spec.zkey).resolve()), str(Path(spec.r1cs).resolve()),  # type: ignore[arg-type]
                              str(Path(spec.wasm).resolve()) if spec.wasm else None)

    def _ref(self, circuit_id: str) -> msg.CircuitRef:
        ref = self._refs.get(circuit_id)
        if ref is None:
            raise InputError(f"unknown circuit {circuit_id!r} (registered: {', '.join(sorted(self._refs)) or 'none'})")
        return ref

    def preload(self, circuit_id: str) -> None:
        """Load the key into every prover process (GPU: resident on the device); blocks until done."""
        with self._cond:
            ref = self._ref(circuit_id)
            if self._state != "running":
                raise CuzkError(f"engine {self.prefix}: preload needs a running engine (state {self._state})")
            provers = [s.spec.name for s in self.sup.ready("gpu")]  # type: ignore[union-attr]
            for name in provers:
                self.srs.pop((circuit_id, name), None)
            self.sup.broadcast(msg.LoadKey(ref), role="gpu")  # type: ignore[union-attr]
            done = self._cond.wait_for(lambda: all((circuit_id, n) in self.srs for n in provers),
                                       timeout=self.config.start_timeout_s)
            errors = [f"{n}: {self.srs[(circuit_id, n)].error}" for n in provers
                      if (circuit_id, n) in self.srs and self.srs[(circuit_id, n)].error]
        if errors:
            raise InputError(f"preload {circuit_id}: " + "; ".join(errors))
        if not done:
            raise ResourceError(f"preload {circuit_id}: not loaded within {self.config.start_timeout_s} s")

    def evict(self, circuit_id: str) -> bool:
        """Drop the key from the prover processes; False (nothing done) if a job still uses it."""
        with self._lock:
            self._ref(circuit_id)
            if self.sched.uses_circuit(circuit_id):
                return False
            if self.sup is not None:
                self.sup.broadcast(msg.EvictKey(circuit_id), role="gpu")
            return True

    # ---- jobs
    def submit(self, job: JobSpec) -> None:
        """Queue a job (never blocks on the ring); InputError for an unknown circuit or bad partitions."""
        with self._lock:
            if self._state != "running":
                raise CuzkError(f"engine {self.prefix} is {self._state}: not accepting jobs")
            ref = self._ref(job.circuit_id)
            self._check_partitions(job, ref)
            if job.job_id in self.sched.jobs:
                raise InputError(f"job {job.job_id} is already queued or running")
            self.sched.add_job(job, ref)
            self._wake()

    @staticmethod
    def _check_partitions(job: JobSpec, ref: msg.CircuitRef) -> None:
        if not job.job_id or not job.partitions:
            raise InputError(f"job {job.job_id!r}: needs an id and at least one partition")
        for i, p in enumerate(job.partitions):
            where = f"job {job.job_id} partition {i}"
            if p.kind not in INPUT_KINDS:
                raise InputError(f"{where}: input kind {p.kind!r} is not one of {', '.join(INPUT_KINDS)}")
            if p.kind == "json" and ref.wasm is None:
                raise InputError(f"{where}: 'json' input but circuit {ref.circuit_id} has no wasm")
            if p.kind == "synthetic" and ref.synthetic is None:
                raise InputError(f"{where}: 'synthetic' input but circuit {ref.circuit_id} is not synthetic")
            if p.kind in ("json", "wtns") and not p.data:
                raise InputError(f"{where}: empty {p.kind} data")

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: queued partitions dropped, running ones stop at their next boundary."""
        with self._lock:
            out = self.sched.cancel(job_id)
            if out is None:
                return False
            self._apply(out)
            self._wake()
            return True

    def status(self) -> dict[str, object]:
        """A JSON-able snapshot (see :func:`~.engine_views.engine_status`)."""
        with self._lock:
            return engine_status(self)

    def metrics(self) -> dict[str, object]:
        """Counters, gauges and stage histograms (see :func:`~.engine_views.engine_metrics`)."""
        with self._lock:
            return engine_metrics(self)

    # ---- the event thread
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _loop(self) -> None:
        assert self.sup is not None
        while True:
            with self._lock:
                table = self.sup.by_fd()
            ready = wait([*table, self._wake_r], timeout=POLL_S)
            with self._cond:
                try:
                    self._handle_ready(ready, table)
                except Exception:  # noqa: BLE001 - a bug here must be loud, not kill the event thread
                    log.exception("engine event handling failed")
                self._cond.notify_all()
                callbacks = list(self._callbacks)
                self._callbacks.clear()
            for cb in callbacks:
                try:
                    cb()
                except Exception:  # noqa: BLE001 - a caller's callback must not kill the engine
                    log.exception("engine callback failed")
            if self._state == "stopped":  # read after the callbacks: one of them may have called stop()
                return

    def _handle_ready(self, ready: list[object], table: dict[object, tuple[str, str]]) -> None:
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        for obj in ready:  # messages first: a dying child's last words come before its death
            if table.get(obj, ("", ""))[1] == "conn":
                self._drain(table[obj][0])
        for obj in ready:
            if table.get(obj, ("", ""))[1] == "sentinel":
                self._on_death(table[obj][0])
        self._check_start_timeouts()
        self._dispatch()

    def _drain(self, name: str) -> None:
        slot = self.sup.slots[name]  # type: ignore[union-attr]
        conn = slot.handle.conn  # type: ignore[union-attr]
        try:
            while not conn.closed and conn.poll():
                self._on_message(name, msg.decode_from_child(conn.recv_bytes()))
        except (EOFError, OSError):
            slot.handle.close()  # type: ignore[union-attr]  # the child is gone; its sentinel follows

    def _on_message(self, name: str, m: msg.FromChild) -> None:
        from .engine_events import handle_message

        handle_message(self, name, m)

    def _on_death(self, name: str) -> None:
        from .engine_events import handle_death

        handle_death(self, name)

    def _check_start_timeouts(self) -> None:
        from .engine_events import check_start_timeouts

        check_start_timeouts(self)

    def _dispatch(self) -> None:
        """Hand queued partitions to idle synthesis workers (running, or draining for started jobs)."""
        if self._state not in ("running", "draining") or self.sup is None:
            return
        for slot in self.sup.ready("synth"):
            if slot.busy is not None:
                continue
            task = self.sched.next_task(started_only=self._state == "draining")
            if task is None:
                return
            self._send_task(slot, task)

    def _send_task(self, slot: object, task: Task) -> None:
        p = task.job.spec.partitions[task.index]
        slot.busy, task.worker = task.task_id, slot.spec.name  # type: ignore[attr-defined]
        slot.handle.send(msg.SynthTask(  # type: ignore[attr-defined]
            task.task_id, task.job.spec.job_id, task.job.seq, task.index, int(task.job.spec.priority),
            task.attempt, task.job.circuit, p.kind, p.data, p.seed, task.job.submitted_at, task.t_dispatch or 0.0))

    def _apply(self, out: Outcome) -> None:
        """Queue callbacks; drop cancelled attempts from the ring and tell the children."""
        if out.cancel and self.ring is not None and self.sup is not None:
            ids = [t.task_id for t in out.cancel]
            self.ring.drop_ready(set(ids))
            self.sup.broadcast(msg.CancelTasks(ids))
        for job_id, result in out.partitions:
            if self.on_partition_done is not None:
                cb = self.on_partition_done
                self._callbacks.append(lambda cb=cb, j=job_id, r=result: cb(j, r))  # type: ignore[misc]
        for jr in out.jobs:
            if self.on_job_done is not None:
                cb2 = self.on_job_done
                self._callbacks.append(lambda cb=cb2, r=jr: cb(r))  # type: ignore[misc]
        self._cond.notify_all()


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


def _release_ipc(prefix: str, wake_r: int, wake_w: int) -> None:
    """Finalizer: unlink every IPC object of the prefix, close the wake-up pipe, free the prefix."""
    cleanup_stale(prefix)
    with _LIVE_LOCK:
        _LIVE_PREFIXES.discard(prefix)
    for fd in (wake_r, wake_w):
        try:
            os.close(fd)
        except OSError:
            pass
