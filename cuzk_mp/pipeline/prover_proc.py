"""Prover processes (``cuzk-prover-<dev>``): ring slot -> staged partition -> MSM sums -> proof.

One OS process per device, bound to its GPU before anything imports CuPy (the
engine sets ``CUDA_VISIBLE_DEVICES=<dev>`` in the child's environment, so the
process sees its GPU as device 0). With the CPU backend the same process type
runs the CPU prover (the engine's ``devices`` then simulate devices: one process each).

Owns, per process: the backend (its device, streams, compiled kernels), the
resident proving keys (:class:`~.key_cache.KeyCache`, LRU beyond ``srs_budget_bytes``), the
staged partitions in flight, and the ring slots it has taken (STAGING).

Threads:

* ``gpu_workers_per_device`` workers: take the oldest READY slot, read it
  through this process's mapping of its segment (kept across partitions,
  docs/ring.md), stage it (copy to the device, or into private memory on the
  CPU; a segment of w alone: w copied and a, b, c made on the device from the circuit
  data, mapped once per key), **free the slot right after staging, before compute**, then run
  ``prove_start_batch`` under the per-device lock, so staging of one partition
  overlaps the compute of another while kernels never interleave. When more
  small partitions are READY at that moment, a worker takes up to ``batch_max``
  in all (never waiting for more; fewer where the backend's memory plan caps the
  batch: ``batch_limit``) and proves those of one key in one pass: a lone
  partition goes alone, at once;
* one finalizer: assembly with fresh r, s and the self-verification, off the
  workers' path; it takes every partition already queued (up to
  ``types.FINALIZE_BATCH_MAX``, never waiting) and verifies those of one key in one
  pairing check, a lone one at once; the proof leaves as snarkjs proof.json, the
  form the caller gets;
* one reader: engine messages (load/evict key, cancel, stop).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import Cancelled, GpuDead, error_kind
from . import messages as msg
from .key_cache import KeyCache, ResidentKey
from .procs import CancelledIds, ChildContext
from .ring import Ring, RingHandle, SlotRecord
from .types import BATCH_MAX_BYTES, finalize_batch, prover_batch


# The interpreter's GIL hand-over interval in the prover: every kernel launch and device wait
# drops the GIL, and with the default 5 ms another busy thread (a finisher's host part, a
# worker's staging) could hold it that long each time it is wanted back.
SWITCH_INTERVAL_S = 0.0005
# Partitions finalized together at most: their self-verification is one pairing check of k + 3 pairs
# (arkworks lets the other threads have the GIL while it runs: perf/finalize_bench.py measures it).
T = TypeVar("T")


@dataclass(frozen=True)
class ProverPayload:
    """Start arguments of a prover process."""

    ring: RingHandle
    backend: str  # "cpu" | "gpu"
    device: int  # device id (GPU) or process index (CPU)
    workers: int
    verify: bool
    srs_budget_bytes: int | None
    batch_max: int = 1  # READY partitions of one key proved in one pass, at most


@dataclass
class _InFlight:
    meta: msg.SegmentMeta
    key: ResidentKey
    public: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    sums: Any = None


class Prover:
    """The threads of one prover process (see the module docstring)."""

    def __init__(self, ctx: ChildContext, ring: Ring, backend: Any, payload: ProverPayload) -> None:
        self.ctx = ctx
        self.ring = ring
        self.backend = backend
        self.payload = payload
        self.batch_max = prover_batch(payload.batch_max)
        self.keys = KeyCache(ctx, backend, payload.srs_budget_bytes, self.batch_max, payload.ring.n_slots)
        self.device_lock = threading.Lock()
        self.finalize_q: queue.Queue[_InFlight | None] = queue.Queue()
        self.cancelled = CancelledIds()
        self.memwatch = DeviceMemoryWatch(refresh=backend.refresh_host_stats) if backend.name == "gpu" else None

    def read_messages(self) -> None:
        """Reader thread: key management, cancellations, stop."""
        for m in self.ctx.messages():
            if isinstance(m, msg.CancelTasks):
                self.cancelled.update(m.task_ids)
            elif isinstance(m, msg.LoadKey):  # its KeyState, an error's too, is the key cache's to send
                self._safe_key_op(m.circuit.circuit_id, lambda: self.keys.preload(m.circuit), report=False)
            elif isinstance(m, msg.EvictKey):
                self._safe_key_op(m.circuit_id, lambda: self.keys.evict(m.circuit_id))

    def _safe_key_op(self, circuit_id: str, op: Any, report: bool = True) -> None:
        try:
            op()
        except Exception as exc:  # noqa: BLE001 - reported to the engine, the process carries on
            self.ctx.log.error("key %s: %s", circuit_id, exc)
            if report:
                self.ctx.send(msg.KeyState(circuit_id, None, 0, error=f"{type(exc).__name__}: {exc}",
                                           error_kind=error_kind(exc)))

    def work(self) -> None:
        """A worker thread: take a slot (and, when small partitions wait in the ring, up to
        :meth:`batch_cap` - 1 more), stage each and release its slot, compute under the device lock
        (the partitions of one key in one pass). Never more than the cap staged at once: a key
        loaded by this batch's first partition may lower it (its device plan), and then what is
        staged computes before the rest of the batch stages."""
        while not self.ctx.stopping.is_set():
            rec = self.ring.take_ready(abort=self.ctx.stopping.is_set)
            if rec is None:
                continue
            recs = [rec, *self._more_ready(rec)]
            for r in recs:
                self.ctx.send(msg.Taken(r.task_id, r.slot, os.getpid()))
            staged: list[tuple[_InFlight, Any]] = []
            for r in recs:
                if len(staged) >= self.batch_cap():
                    self._compute_staged(staged)
                    staged = []
                try:
                    staged.append(self._take_slot(r))
                except GpuDead:
                    raise
                except Exception as exc:  # noqa: BLE001 - the task fails, the process carries on
                    self.ctx.fail(r.task_id, exc)
            self._compute_staged(staged)

    def _compute_staged(self, staged: list[tuple[_InFlight, Any]]) -> None:
        """Compute staged partitions, those of one key in one pass."""
        for group in _by_key(staged, lambda item: item[0].key):
            self._compute_batch(group)

    def batch_cap(self) -> int:
        """The most partitions a worker stages at once: ``batch_max``, or fewer where the backend's
        memory plan allows fewer (``backend.batch_limit``: a small device, many keys resident)."""
        limit = self.backend.batch_limit
        return self.batch_max if limit is None else max(1, min(self.batch_max, int(limit)))

    def _more_ready(self, first: SlotRecord) -> list[SlotRecord]:
        """Up to :meth:`batch_cap` - 1 more READY slots, taken without waiting, when the first partition
        is small enough to batch (:data:`BATCH_MAX_BYTES`) and others as small are ready now (a big one
        waits for a worker of its own: staged beside a batch it would be on the device beyond the plan).
        They may be other keys' partitions (grouped by key once staged): the cap bounds them all."""
        want = self.batch_cap() - 1
        if want <= 0 or first.nbytes > BATCH_MAX_BYTES:
            return []
        ready = sum(1 for r in self.ring.snapshot() if r.state == "ready" and r.nbytes <= BATCH_MAX_BYTES)
        out: list[SlotRecord] = []
        for _ in range(min(want, ready)):
            rec = self.ring.take_ready(abort=lambda: True, timeout_s=0, max_nbytes=BATCH_MAX_BYTES)
            if rec is None:  # another worker was first
                break
            out.append(rec)
        return out

    def _take_slot(self, rec: SlotRecord) -> tuple[_InFlight, Any]:
        """Stage a taken slot's partition and free the slot (before any compute of it)."""
        t_taken = time.monotonic()  # the clock of the slot's t_ready
        try:
            seg = self.ring.open_segment(rec.slot)
            try:
                meta = msg.decode_meta(seg.meta)
                key = self.keys.acquire(meta.circuit)
                job = _InFlight(meta, key, [], dict(meta.timings))
                job.timings["ring_wait"] = job.timings.get("ring_wait", 0.0) + (t_taken - rec.t_ready)
                t0 = time.perf_counter()
                staged = self._stage(job, seg.arrays)
                job.timings["staging"] = time.perf_counter() - t0
            finally:
                seg.close()
        finally:
            self.ring.release(rec.slot)  # FREE again: before any compute of this partition
        return job, staged

    def _stage(self, job: _InFlight, arrays: list[Any]) -> Any:
        from ..backends.base import ProverInputs
        from ..groth16.prover import public_signals

        w = arrays[-1]
        job.public = public_signals(w, job.meta.n_public)
        try:
            if len(arrays) == 1:  # w alone: a, b, c are made on the device (CircuitRef.witness_map)
                return self.backend.stage_witness(job.key.handle, job.key.witness_rows(), w)
            a, b, c = arrays[:3]
            return self.backend.stage(job.key.handle, ProverInputs(a=a, b=b, c=c, w=w))
        except BaseException:
            self.keys.release(job.key)
            raise

    def _compute_batch(self, group: list[tuple[_InFlight, Any]]) -> None:
        """prove_start_batch over staged partitions of one key under the device lock; a cancelled
        partition drops out (before the lock, and again once it is held), a failure fails each of
        the group's tasks. Each partition's ``device`` timing is its share of the pass
        (``device_batch``: how many shared it); ``gpu_<stage>``: the backend's own split of the device
        work (a batch's shared pass for each of its partitions)."""
        from ..groth16.prover import prove_start_batch

        t0 = time.perf_counter()
        live = self._drop_cancelled(group)
        if not live:
            return
        sums: list[Any] = []
        try:
            with self.device_lock:
                t1 = time.perf_counter()
                live = self._drop_cancelled(live)
                if live:
                    sums = prove_start_batch(self.backend, live[0][0].key.handle, [s for _, s in live],
                                             live[0][0].meta.n_public)
            t2 = time.perf_counter()
        except GpuDead:
            raise
        except Exception as exc:  # noqa: BLE001 - the group's tasks fail, the process carries on
            for job, staged in live:
                self.backend.release(staged)
                self.keys.release(job.key)
                self.ctx.fail(job.meta.task_id, exc)
            return
        for (job, staged), s in zip(live, sums):
            # the backend's own split of the device work (GPU: its CUDA events), as gpu_<stage> seconds
            job.timings.update({f"gpu_{k}": ms / 1e3 for k, ms in self.backend.release(staged).items()})
            job.sums = s
            job.timings["device_wait"], job.timings["device"] = t1 - t0, (t2 - t1) / len(live)
            job.timings["device_batch"] = float(len(live))
            self.finalize_q.put(job)

    def _drop_cancelled(self, group: list[tuple[_InFlight, Any]]) -> list[tuple[_InFlight, Any]]:
        live = []
        for job, staged in group:
            try:
                self._check(job)
            except Cancelled as exc:
                self.backend.release(staged)
                self.keys.release(job.key)
                self.ctx.fail(job.meta.task_id, exc)
            else:
                live.append((job, staged))
        return live

    def _check(self, job: _InFlight) -> None:
        if job.meta.task_id in self.cancelled:
            raise Cancelled(f"job {job.meta.job_id} partition {job.meta.partition} was cancelled")

    def finalize(self) -> None:
        """The finalizer thread: proof assembly with fresh r, s and self-verification. It takes every
        partition already queued (up to :data:`~.types.FINALIZE_BATCH_MAX`, never waiting for more) and
        finalizes those of one key together, verified in one pairing check; a lone one goes at once."""
        cap = finalize_batch()  # checked by EngineConfig.validate before any process started
        while True:
            jobs, stop = self._queued_for_finalize(cap)
            for group in _by_key(jobs, lambda job: job.key):
                self._finalize_group(group)
            if stop:
                return

    def _queued_for_finalize(self, cap: int) -> tuple[list[_InFlight], bool]:
        """The next partition to finalize (waiting for one) and up to ``cap - 1`` queued behind it,
        without waiting; and whether the stop marker came."""
        first = self.finalize_q.get()
        if first is None:
            return [], True
        jobs = [first]
        while len(jobs) < cap:
            try:
                job = self.finalize_q.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
        return jobs, False

    def _finalize_group(self, group: list[_InFlight]) -> None:
        """Finalize partitions of one key together; a cancelled one is skipped. Every key use is
        released once its partition is answered."""
        live: list[_InFlight] = []
        for job in group:
            try:
                self._check(job)
                live.append(job)
            except Cancelled as exc:
                self.ctx.fail(job.meta.task_id, exc)
                self.keys.release(job.key)
        try:
            if live:
                self._finalize_live(live)
        finally:
            for job in live:
                self.keys.release(job.key)

    def _finalize_live(self, live: list[_InFlight]) -> None:
        """prove_finalize_batch over partitions of one key: a proof that fails self-verification fails
        its own task alone; if the batch raises, each partition is finalized alone, so one bad input
        fails only its task. Each partition's ``finalize`` timing is its share of the batch
        (``finalize_batch``: how many shared it). A partition whose witness synthesis checked against
        the r1cs (``SegmentMeta.witness_checked``) fails its self-check naming the key."""
        from ..errors import VerificationFailed
        from ..formats.snarkjs_json import proof_to_json
        from ..groth16.prover import prove_finalize_batch

        try:
            t0 = time.perf_counter()
            results = prove_finalize_batch(live[0].key.zkey, [(job.sums, job.public) for job in live],
                                           verify=self.payload.verify,
                                           witness_checked=[job.meta.witness_checked for job in live])
            share = (time.perf_counter() - t0) / len(live)
        except Exception as exc:  # noqa: BLE001 - the task fails, the process carries on
            if len(live) == 1:
                self.ctx.fail(live[0].meta.task_id, exc)
            else:
                self.ctx.log.warning("finalizing %d partitions together failed (%s: %s): one by one",
                                     len(live), type(exc).__name__, exc)
                for job in live:
                    self._finalize_live([job])
            return
        for job, result in zip(live, results):
            if isinstance(result, VerificationFailed):
                self.ctx.fail(job.meta.task_id, result)
                continue
            job.timings["finalize"], job.timings["finalize_batch"] = share, float(len(live))
            try:
                self.ctx.send(msg.ProofDone(job.meta.task_id, proof_to_json(result), [str(x) for x in job.public],
                                            job.timings, backend_stats(self.backend, self.memwatch)))
            except Exception as exc:  # noqa: BLE001 - the task fails, the process carries on
                self.ctx.fail(job.meta.task_id, exc)


class DeviceMemoryWatch:
    """Bytes in use on this process's GPU (total - usable free, CuPy's idle pool blocks counted free),
    sampled every ``interval_s`` by a thread; keeps the peak. Short peaks between samples are missed.
    Every ``refresh_s`` the same thread calls ``refresh`` (the backend's host-memory figures, too slow
    to read on a proof's path)."""

    def __init__(self, interval_s: float = 0.05, refresh: Callable[[], None] | None = None,
                 refresh_s: float = 10.0) -> None:
        from ..backends.gpu.memory import free_bytes

        self._free_bytes = free_bytes
        self.interval_s = interval_s
        self.refresh, self.refresh_s = refresh, refresh_s
        self.used = self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="cuzk-prover-memwatch", daemon=True).start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            free, total = self._free_bytes()
            self.used = total - free
            self.peak = max(self.peak, self.used)
            if self.refresh is not None and time.monotonic() - last >= self.refresh_s:
                last = time.monotonic()
                self.refresh()

    def stats(self) -> dict[str, float]:
        """``device_used_bytes`` (last sample) and ``device_peak_bytes``."""
        return {"device_used_bytes": float(self.used), "device_peak_bytes": float(self.peak)}

    def stop(self) -> None:
        """End the sampling thread."""
        self._stop.set()


def _by_key(items: list[T], key_of: Callable[[T], Any]) -> list[list[T]]:
    """Items grouped by resident key (``key_of``: an item's key), in the order the keys first appear."""
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(id(key_of(item)), []).append(item)
    return list(groups.values())


def backend_stats(backend: Any, memwatch: DeviceMemoryWatch | None) -> dict[str, float]:
    """The backend's own figures (``busy_seconds``: its kernel-busy counter, CUDA events on the GPU;
    what it holds of its keys) and the device memory in use."""
    stats = dict(backend.stats())
    if memwatch is not None:
        stats.update(memwatch.stats())
    return stats


def _make_backend(payload: ProverPayload) -> Any:
    from ..backends import get_backend

    if payload.backend == "gpu":
        # CUDA_VISIBLE_DEVICES=<dev>: our GPU is device 0 here; each worker holds one partition on it
        return get_backend("gpu", device=0, in_flight=payload.workers)
    return get_backend("cpu", threads=int(os.environ.get("NUMBA_NUM_THREADS", "1")))


def main(ctx: ChildContext, payload: ProverPayload) -> None:
    """Process entry (called by :func:`cuzk_mp.pipeline.procs.bootstrap`)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ring = Ring.attach(payload.ring)
    backend = _make_backend(payload)
    if payload.backend == "gpu":
        from ..backends.gpu.modules import origins, warm_up

        took = warm_up()  # load the prover's kernel modules (NVRTC where no shipped binary fits) before READY
        ctx.log.info("[start] kernel modules ready in %.2f s (%s)", sum(took.values()), origins())
    prover = Prover(ctx, ring, backend, payload)
    workers = [threading.Thread(target=prover.work, name=f"{ctx.name}-worker-{i}", daemon=True)
               for i in range(payload.workers)]
    finalizer = threading.Thread(target=prover.finalize, name=f"{ctx.name}-finalize", daemon=True)
    for t in (*workers, finalizer):
        t.start()
    threading.Thread(target=prover.read_messages, name=f"{ctx.name}-io", daemon=True).start()
    ctx.send(msg.Ready(os.getpid(), ctx.name, {"backend": backend.name, "device": payload.device,
                                                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    ctx.log.info("[start] ready (%s backend, %d workers)", backend.name, payload.workers)
    try:
        while not ctx.stopping.wait(0.5):
            if not all(t.is_alive() for t in workers):
                raise GpuDead(f"{ctx.name}: a worker thread died (device error); the process restarts")
            if not finalizer.is_alive():  # its partitions would wait for task_timeout: restart instead
                raise RuntimeError(f"{ctx.name}: the finalizer thread died; the process restarts")
        for t in workers:  # drain: finish the partitions in hand (bounded by the engine's grace)
            t.join()
    finally:
        prover.finalize_q.put(None)
        finalizer.join(60)
        if prover.memwatch is not None:
            prover.memwatch.stop()
        ring.close()
