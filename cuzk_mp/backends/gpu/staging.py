"""Staging a partition on a GpuBackend: its vectors copied to the device, w's scalars classified.

Why a module of its own: staging is the partition's only host-bound step. :class:`_Staging` takes
a place under the in-flight limit (:mod:`.device_limits`), copies a, b, c, w (or w alone, for the
device witness map, whose coded rows the key keeps) on the thread's main stream, from page-locked
memory directly or through two pinned bounce buffers filled by parallel host copies, and makes
w's scalar plan (a dense plan up to DENSE_KEY_ROWS, else the 0/1/other classification and the
sorts its MSMs share).
"""

from __future__ import annotations

import time
from typing import Any

import cupy
import numpy as np

from ...errors import InputError
from ..base import ProverInputs, WitnessRows
from . import memory, msm_plan
from .backend_state import _H2D, COPY_THREADS, GpuKey, GpuStaged, _Streams
from .device_limits import _DeviceLimits
from .msm_geometry import DENSE_KEY_ROWS
from .witness_map import DeviceWitnessMap

BOUNCE_BYTES = 64 << 20  # one pinned staging buffer at most (two per thread)
MIN_BOUNCE_BYTES = 1 << 20
PARALLEL_COPY_BYTES = 8 << 20  # below this a bounce buffer is filled by one thread
W_SECTIONS = ("a", "b1", "b2")  # the MSMs over the whole witness: one plan, so they share its sorts


class _Staging(_DeviceLimits):
    """Partitions staged on a GpuBackend (a base of :class:`.backend.GpuBackend`)."""

    def stage(self, key: GpuKey, inputs: ProverInputs) -> GpuStaged:
        """Copy a, b, c, w to the device on this thread's main stream and classify w's scalars
        (a key up to :data:`DENSE_KEY_ROWS`: a dense plan, and the check that every scalar is
        canonical is read when the MSMs' results are, so nothing here waits for the device); on
        return the host vectors are no longer read (the caller may free them)."""
        z = key.zkey
        shapes = {"a": (z.domain_size, 4), "b": (z.domain_size, 4), "c": (z.domain_size, 4), "w": (z.n_vars, 4)}
        host = {k: np.ascontiguousarray(getattr(inputs, k), dtype=np.uint64) for k in shapes}
        for k, shape in shapes.items():
            if host[k].shape != shape:
                raise InputError(f"partition vector {k} has shape {host[k].shape}, the key expects {shape}")
        return self._stage(key, host, None, "staging a partition (a, b, c, w)")

    def stage_witness(self, key: GpuKey, rows: WitnessRows, w: np.ndarray) -> GpuStaged:
        """Copy w; a, b, c are computed from it on the device (:mod:`.witness_map`) when the
        partition computes, so a staged partition waiting for the device holds w alone (the device
        plan counts it so: :func:`.plan.partition_bytes`). The key keeps the circuit's coded rows on
        the device from its load (given them) or its first such partition (for the same ``rows``
        object; another one replaces them). ``w`` must be canonical (the caller validates it)."""
        z = key.zkey
        w = np.ascontiguousarray(w, dtype=np.uint64)
        if w.shape != (z.n_vars, 4):
            raise InputError(f"witness has shape {w.shape}, the key expects {(z.n_vars, 4)}")
        with cupy.cuda.Device(self.device), self._lock:
            if key.witness_map is None or key.witness_map[0] is not rows:
                if key.witness_map is not None:  # rare (another evaluator for this key): let every
                    cupy.cuda.Device().synchronize()  # thread's map that reads the old rows finish first
                    old = key.witness_map[1]
                    key.witness_map = None
                    # a partition staged with the old rows and not yet computed keeps them (its own
                    # reference, dropped at its release, once the device is done with them)
                    if not any(p.witness_map is old for p in self._parts.values()):
                        old.close()
                key.witness_map = (rows, DeviceWitnessMap.of_rows(rows, z.domain_size))
            wmap = key.witness_map[1]
        return self._stage(key, {"w": w}, wmap, "staging a partition (w alone; a, b, c made from it later)")

    def _stage(self, key: GpuKey, host: dict[str, np.ndarray], wmap: DeviceWitnessMap | None,
               what: str) -> GpuStaged:
        """Copy ``host``'s vectors on this thread's main stream (with ``wmap``: w alone, the map kept
        for :meth:`h_values`) and classify w (see :meth:`stage`)."""
        z = key.zkey
        st = self.streams()
        holder = self._take_stage_slot()
        try:
            with cupy.cuda.Device(self.device), st.main:
                rows = {k: z.domain_size for k in "abc" if wmap is None} | {"w": z.n_vars}
                memory.ensure_free(32 * sum(rows.values()), what)
                start = cupy.cuda.Event()
                start.record(st.main)
                d = {k: cupy.empty((n, 4), dtype=np.uint64) for k, n in rows.items()}
                for k, v in host.items():
                    self._h2d(d[k], v, st)
                t0 = time.perf_counter()
                canonical = None
                if int(z.domain_size) <= DENSE_KEY_ROWS:
                    canonical = msm_plan.check_canonical(d["w"], st.main)
                    plan = msm_plan.dense_plan(int(d["w"].shape[0]))
                    ready = _record(st.main)
                else:
                    ready = _record(st.main)
                    plan = msm_plan.classify(d["w"], cuts=(z.n_public + 1,), supports=key.support_rows)  # waits
                    plan.sorts = msm_plan.SharedSorts.for_msms(
                        [key.msms[s] for s in W_SECTIONS if s in key.msms and s not in key.supports], plan.n2)
                    for name, sub in plan.subsets.items():
                        sub.sorts = msm_plan.SharedSorts.for_msms(
                            [key.msms[s] for s, g in key.supports.items() if g == name and s in key.msms], sub.n2)
                timings = {"classify": 1e3 * (time.perf_counter() - t0)}
        except BaseException:
            self._free_stage_slot(holder)
            raise
        nbytes = sum(int(a.nbytes) for a in d.values()) + sum(int(p.scalars.nbytes) for p in plan.subsets.values())
        staged = GpuStaged(self.device, d, plan, ready, nbytes, timings,
                           holder=holder, canonical=canonical, copy_start=start, witness_map=wmap)
        with self._lock:
            self._parts[int(d["w"].data.ptr)] = staged
        return staged

    def _h2d(self, dst: Any, src: np.ndarray, st: _Streams) -> None:
        """src -> dst on st.main: straight from page-locked memory, else through the thread's two
        pinned bounce buffers, each filled by parallel host copies while the other one's DMA runs."""
        if src.nbytes == 0:
            return
        if _is_pinned(src):
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, _H2D, st.main.ptr)
            return
        self._ensure_bounce(st, src.nbytes)
        size = int(st.bounce[0].nbytes)
        flat = src.reshape(-1).view(np.uint8)
        for lo in range(0, flat.nbytes, size):
            k = st.turn = st.turn ^ 1  # alternate across arrays too: b fills one buffer while a's DMA runs
            n = min(size, flat.nbytes - lo)
            if st.bounce_events[k] is not None:
                st.bounce_events[k].synchronize()  # that buffer's previous DMA is done
            self._parallel_copy(st.bounce[k][:n], flat[lo : lo + n])
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr + lo, st.bounce[k].ctypes.data, n, _H2D, st.main.ptr)
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(st.main)
            st.bounce_events[k] = ev

    def _ensure_bounce(self, st: _Streams, nbytes: int) -> None:
        """The thread's two pinned bounce buffers, at least min(nbytes, BOUNCE_BYTES) each: sized to
        the partition (a power of two from 1 MiB), so a small proof does not page-lock 128 MiB."""
        want = min(BOUNCE_BYTES, max(MIN_BOUNCE_BYTES, 1 << max(0, nbytes - 1).bit_length()))
        have = int(st.bounce[0].nbytes) if st.bounce else 0
        if have >= min(nbytes, BOUNCE_BYTES):
            return
        for ev in st.bounce_events:
            if ev is not None:
                ev.synchronize()  # the old buffers' last DMA is done before they go back to the pool
        st.bounce = [np.frombuffer(cupy.cuda.alloc_pinned_memory(want), dtype=np.uint8, count=want) for _ in range(2)]
        st.bounce_events = [None, None]
        with self._lock:
            self._pinned_bytes += 2 * (want - have)

    def _parallel_copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        if src.nbytes < PARALLEL_COPY_BYTES:  # a thread hand-off costs more than it saves
            np.copyto(dst, src)
            return
        step = -(-src.nbytes // COPY_THREADS)
        futs = [self._copier.submit(np.copyto, dst[lo : lo + step], src[lo : lo + step])
                for lo in range(0, src.nbytes, step)]
        for f in futs:
            f.result()


def _record(stream: Any) -> Any:
    ev = cupy.cuda.Event()
    ev.record(stream)
    return ev


def _is_pinned(a: np.ndarray) -> bool:
    """Whether a host array lies in page-locked memory (cudaHostAlloc'd or registered)."""
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(int(a.ctypes.data))
    except cupy.cuda.runtime.CUDARuntimeError:
        return False
    return int(getattr(attrs, "type", 0)) == 1  # cudaMemoryTypeHost

