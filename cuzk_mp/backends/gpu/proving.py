"""The proving passes of a staged partition on a GpuBackend: witness map, H step, MSMs, release.

Why a module of its own: these only enqueue. :class:`_Proving` finds the partition and plan of an
MSM's scalars (w, a suffix of it, or H values), enqueues the witness map and the H step on the
thread's main stream and each MSM on its stream (a small key's batch as one pass), hands each
result's host part to a finisher thread, and at release waits for the device, records the
partition's timings and its busy span, and frees its buffers and staging place.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import cupy
import numpy as np

from ...errors import InputError
from . import memory, msm_plan
from .backend_state import GpuKey, GpuStaged, _Run
from .device_limits import _DeviceLimits
from .msm_geometry import SECTIONS, batches_msms
from .staging import _record


class _Proving(_DeviceLimits):
    """The passes of partitions staged on a GpuBackend (a base of :class:`.backend.GpuBackend`)."""

    def _context(self, scalars: Any) -> tuple[GpuStaged | None, Any, Any]:
        """(partition, plan, event to wait for) for MSM scalars: the staged w or a row suffix of
        it (w's plan, cut; the staging event), a partition's H values (a dense plan; the H step's
        event), or (None, None, None) for anything else."""
        if not isinstance(scalars, cupy.ndarray) or scalars.ndim != 2 or not scalars.flags.c_contiguous:
            return None, None, None
        ptr = int(scalars.data.ptr)
        with self._lock:
            parts = list(self._parts.values())
        for p in parts:
            if p.h is not None and int(p.h.data.ptr) == ptr and p.h.shape == scalars.shape:
                return p, msm_plan.dense_plan(int(scalars.shape[0])), p.h_ready
            w = p.d.get("w")
            if w is None:
                continue
            lo = int(w.data.ptr)
            k, rem = divmod(ptr - lo, 32)
            if lo <= ptr < lo + int(w.nbytes) + 1 and not rem and k + scalars.shape[0] == w.shape[0]:
                return p, p.plan.tail(k), p.ready
        return None, None, None

    def h_values(self, key: GpuKey, staged: GpuStaged) -> Any:
        """p[j] = (A*B - C)(w_2n^(2j+1)) in standard form, written over the staged a (b and c are
        clobbered); enqueued on this thread's main stream. A partition staged as w alone first gets
        its a, b, c from the witness map there (the ``witness_map`` span)."""
        if not staged.d or staged.h is not None:
            raise InputError("h_values on a released partition, or twice on one")
        self.map_witness(key, staged)
        st = self.streams()
        with cupy.cuda.Device(self.device), st.main:
            st.main.wait_event(staged.ready)
            d = staged.d
            start = _record(st.main)
            p = self.ntt_engine.coset_h_in_place(d["a"], d["b"], d["c"], stream=st.main)
            end = _record(st.main)
            staged.run.events.append(("ntt_h", start, end))
        staged.h, staged.h_ready = p, end
        return p

    def map_witness(self, key: GpuKey, staged: GpuStaged) -> None:
        """a, b, c of a partition staged as w alone (:meth:`stage_witness`), made from w by the
        key's witness map on this thread's main stream (the ``witness_map`` span); nothing for a
        partition that has them. :meth:`h_values` calls it first."""
        if not staged.d:
            raise InputError("map_witness on a released partition")
        if staged.witness_map is None or "a" in staged.d:
            return
        st = self.streams()
        n = int(key.zkey.domain_size)
        with cupy.cuda.Device(self.device), st.main:
            memory.ensure_free(3 * 32 * n, "a partition's a, b, c (the device witness map)")
            st.main.wait_event(staged.ready)
            start = _record(st.main)
            d = staged.d
            d.update({k: cupy.empty((n, 4), dtype=np.uint64) for k in "abc"})
            staged.witness_map.run(d["w"], d["a"], d["b"], d["c"])
            staged.run.events.append(("witness_map", start, _record(st.main)))

    def msm(self, key: GpuKey, section: str, scalars: Any) -> Future:
        """sum_i scalars[i] P_i over key section ``section`` (G2 for "b2"), enqueued; the Future's
        result is an arkworks point. Scalars: a device (or host) ``(n, 4)`` standard-form array
        with exactly the section's point count."""
        return self.msm_batch(key, section, [scalars])[0]

    def msm_batch(self, key: GpuKey, section: str, scalars: Sequence[Any]) -> list[Future]:
        """The MSMs of k scalar vectors over one section; every vector is checked before any is
        enqueued. A key up to :data:`DENSE_KEY_ROWS` whose vectors are all staged partitions' (w, its
        suffix, or H values) runs them as ONE batched pass on the section's stream; otherwise each
        is enqueued on its own (:meth:`_Streams.msm_stream`) with no host wait but the sorts'.
        Futures in order, as :meth:`msm`'s."""
        if section not in SECTIONS:
            raise InputError(f"unknown MSM section {section!r}: expected one of {', '.join(SECTIONS)}")
        if not key.msms:
            raise InputError("msm with a closed key")
        want = key.counts[section]
        for v in scalars:
            got = int(v.shape[0]) if getattr(v, "ndim", 0) == 2 else -1
            if got != want:
                raise InputError(f"MSM {section}: {got} scalars for the section's {want} points"
                                 if got >= 0 else f"MSM {section}: scalars must be an (n, 4) array, got "
                                 f"{getattr(v, 'shape', type(v).__name__)}")
        st = self.streams()
        if batches_msms(int(key.zkey.domain_size), len(scalars), section in key.supports):
            batched = self._enqueue_batch(key.msms[section], section, scalars, st.msm_stream(key, section, 0))
            if batched is not None:
                return batched
        support = key.supports.get(section)
        rows = key.support_rows[support] if support is not None else None
        return [self._enqueue_msm(key.msms[section], section, v, st.msm_stream(key, section, i), support, rows)
                for i, v in enumerate(scalars)]

    def _enqueue_msm(self, m: Any, section: str, scalars: Any, s: Any, support: str | None = None,
                     rows: Any = None) -> Future:
        """One MSM on stream ``s``: a staged partition's scalars take its plan (the whole witness
        over a section packed to a ``support``'s ``rows``: the plan of those rows' scalars, packed
        at staging), any other vector is classified here (packed first for such a section)."""
        with cupy.cuda.Device(self.device), s:
            part, plan, ready = self._context(scalars)  # C's cut of w's plan is enqueued on s
            if part is not None:
                s.wait_event(ready)
            sub = plan.subsets.get(support) if part is not None and support is not None and plan is part.plan \
                else None
            if sub is not None:
                d_scalars, plan = sub.scalars, sub
            elif part is None or rows is not None:  # a vector of no partition, or one not packed at staging
                d_scalars = cupy.ascontiguousarray(cupy.asarray(scalars))
                if rows is not None:
                    d_scalars = d_scalars[rows]
                plan = msm_plan.classify(d_scalars, m.params.nthreads)
            else:
                d_scalars = scalars
            start = _record(s)
            pending = m.launch(d_scalars, plan)
            end = _record(s)
        if part is not None:
            return self._track(part, section, pending, start, end)
        return self._finisher.submit(self._standalone, pending, start, end)

    def _track(self, part: GpuStaged, section: str, pending: Any, start: Any, end: Any) -> Future:
        """Record a partition's enqueued MSM (its span for the timings, its pending result for
        :meth:`release`) and hand its host part to a finisher thread."""
        part.run.events.append((f"msm_{section}", start, end))
        part.run.pending[section] = pending
        return self._finisher.submit(self._finish, pending, part.canonical)

    def _enqueue_batch(self, m: Any, section: str, scalars: Sequence[Any], s: Any) -> list[Future] | None:
        """The k MSMs as one :meth:`.msm._Msm.launch_batch` on ``s`` (after every partition's data
        is ready), or None when some vector is not a staged partition's with a dense plan."""
        with cupy.cuda.Device(self.device), s:
            ctx = [self._context(v) for v in scalars]
            if any(part is None or plan.other is not None for part, plan, _ in ctx):
                return None
            for _, _, ready in ctx:
                s.wait_event(ready)
            start = _record(s)
            pendings = m.launch_batch(list(scalars), [plan for _, plan, _ in ctx])
            end = _record(s)
        return [self._track(part, section, pending, start, end) for (part, _, _), pending in zip(ctx, pendings)]

    @staticmethod
    def _finish(pending: Any, canonical: np.ndarray | None) -> Any:
        """The MSM's point, after the deferred canonical check of a dense plan's witness (its flag
        was copied back before the partition's ready event, which the MSM's stream waited for). In the
        pipeline synthesis has already refused any witness value >= r before it reached a ring slot, so
        this is a second line of defence; where it fires inside a batch the whole pass fails."""
        out = pending.result()
        if canonical is not None and canonical[0]:
            raise InputError(msm_plan.NON_CANONICAL)
        return out

    def _standalone(self, pending: Any, start: Any, end: Any) -> Any:
        out = pending.result()
        end.synchronize()
        self._add_busy(start, 0.0, float(cupy.cuda.get_elapsed_time(start, end)))
        return out

    def _add_busy(self, ref: Any, lo_ms: float, hi_ms: float) -> None:
        """Count ``[lo_ms, hi_ms]`` after the (completed) event ``ref`` as device-busy time, once
        where it overlaps another partition's span. Events are placed on one timeline by chaining:
        each ``ref`` is placed by its distance from the previous one, a short float32 interval
        while the device is busy, so the placement keeps its precision in a prover that runs for
        weeks (one distance from a fixed start would lose milliseconds after a day)."""
        with self._lock:
            if self._clock is None:
                at = 0.0
            else:
                prev, prev_at = self._clock
                at = prev_at + float(cupy.cuda.get_elapsed_time(prev, ref))
            self._clock = (ref, at)
            self._busy.add(at + lo_ms, at + hi_ms)
            self.busy_seconds = self._busy.covered / 1000.0

    def release(self, staged: GpuStaged) -> dict[str, float]:
        """Drop the partition's device buffers (back to CuPy's pool) after its enqueued work is
        done; records its timings as ``last_timings`` and returns them (the spans of its CUDA events,
        ms; empty on a second call). Idempotent."""
        if not staged.d:
            return {}
        spans: dict[str, float] = {}
        with self._lock:
            self._parts.pop(int(staged.d["w"].data.ptr), None)
        run = staged.run
        for p in run.pending.values():
            p.wait_device()  # the device must be done with these buffers before they go
        if run.events:
            for _, _, end in run.events:
                end.synchronize()
            ref = run.events[0][1]
            starts = [float(cupy.cuda.get_elapsed_time(ref, a)) for _, a, _ in run.events]  # signed ms
            ends = [float(cupy.cuda.get_elapsed_time(ref, b)) for _, _, b in run.events]
            spans = {name: float(cupy.cuda.get_elapsed_time(a, b)) for name, a, b in run.events}
            spans["total"] = max(ends) - min(starts)
            spans.update(staged.timings)
            if staged.copy_start is not None:
                spans["h2d"] = float(cupy.cuda.get_elapsed_time(staged.copy_start, staged.ready))
            self.last_timings = spans
            self._add_busy(ref, min(starts), max(ends))
        staged.d = {}
        staged.witness_map = None  # the rows it was mapped with, kept until the device is done with them
        staged.h = None
        staged.plan = None
        staged.run = _Run()
        self._free_stage_slot(staged.holder)
        staged.holder = None
        return spans
