"""Multi-scalar multiplication on the GPU over G1 and G2 (Pippenger, signed digits, 0/1 split).

Device state: an :class:`MsmG1` / :class:`MsmG2` holds its resident point array
(zkey layout, ``(n, 12)`` / ``(n, 24)`` uint64, Montgomery coordinates,
infinity = all zeros), optionally the precomputed multiples 2^(c w) P of every
point (:class:`Multiples`), and the kernels of ``kernels/msm/msm.cu``; every
other buffer lives only for one run (CuPy's stream-ordered pool recycles them).

One run, for m standard-form scalars (``(m, 4)`` uint64, each < 2^255):

1. A :class:`.msm_plan.ScalarPlan` says which scalars are 0, 1 or other: :func:`.msm_plan.classify`
   (``msm_classify``; it waits for the device, so the prover does it once per
   partition while staging: A, B1, B2 and C share the witness, and
   :meth:`.msm_plan.ScalarPlan.tail` gives C's part without a wait) or
   :func:`.msm_plan.dense_plan` (every scalar "other": the H values).
2. Zeros are dropped. The points whose scalar is 1 are summed by the
   accumulation kernel as ONE bucket (one mixed addition per point, in
   load-balanced segments) instead of ~W additions in Pippenger (supraseal's
   batch-add split for boolean-heavy witnesses).
3. The other scalars go through Pippenger with c-bit signed windows
   (W = ceil(256 / c)): ``msm_digits`` writes one sort key per (window,
   scalar), a counting sort by bucket (``msm_sort_*``, three launches, no host wait) orders
   them when :func:`.msm_passes.counting_sort_takes` the batch (few buckets, and few keys or very few
   buckets), else a stable LSD radix
   sort over the bits the batch's keys use (``msm_radix_*``, two launches and a scan a pass of
   at most 9 bits, no host wait),
   ``msm_accumulate`` adds each run of a bucket with segmented, load-balanced
   threads (where ``MsmParams.grid`` says, grid batch-affine rounds first:
   ``msm_ga_*``, one inversion a round over all its pairs), ``msm_reduce``
   combines runs that cross segments and reduces buckets to window sums.
   Windows are processed in batches so at most
   ``MsmParams.max_entries`` keys exist at once. With precomputed multiples
   every window adds the multiple 2^(c w) P_i into ONE shared bucket set, so
   the reduction runs once instead of W times and larger windows pay
   (:func:`.msm_geometry.choose_multiples_window`).
4. The window sums and the ones' sum are copied into pinned host memory on the
   same stream; :meth:`PendingMsm.result` waits for that copy alone, turns them
   into arkworks points and Horner-combines them on the host (:func:`.msm_host.horner`).

:meth:`_Msm.launch` enqueues all of it on a stream without waiting for the
device, so the caller can enqueue more work, on this stream or another, before
it collects any result.

CUDA graphs (``MsmParams.graphs``, small MSMs): a dense pass whose sort keys number at most
:data:`.msm_params.GRAPH_MAX_ENTRIES` is captured once per batch size into a graph that owns its buffers
(:class:`.msm_graph._GraphRun`); each run copies the scalars into the graph's input, launches the graph
(one call instead of ~20 launches and allocations) and copies the window sums back. A small
MSM's kernels take tens of microseconds each, so the host's launches, not the device, set the
latency of a lone small proof without them.

This module holds the MSM objects and their runs; the scalar plans live in :mod:`.msm_plan`, the
sort and accumulation passes in :mod:`.msm_passes` (the objects' base class), the captured graphs
in :mod:`.msm_graph` and the host side (result copies, Horner, timing marks) in :mod:`.msm_host`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ...errors import InputError
from .env_knobs import grid_rounds
from .knobs import MSM_PATH
from .modules import get_module, occupancy
from .msm_geometry import choose_multiples_window, choose_window, grid_rounds_for, ones_segment, window_count
from .msm_graph import _GraphRun, graphs_supported
from .msm_host import (
    _NULL,
    _address,
    _as_rows,
    _copy_device_async,
    _copy_to_host_async,
    _Marks,
    _pinned_like,
    _u32,
    _u64,
    horner,
)
from .msm_params import GRAPH_RUNS, MsmParams, graph_batch_limit
from .msm_passes import OP_ADD, _MsmPasses
from .msm_plan import ScalarPlan, SharedSorts, classify

# The knob names below are part of this module's surface for the MSM's callers and benches (it
# imported them from the knobs before the MSM's own modules existed); the scalar plans, the passes,
# the graphs and the host helpers are imported from their own modules.
__all__ = [
    "MSM_PATH",
    "MsmG1",
    "MsmG2",
    "MsmParams",
    "Multiples",
    "PendingMsm",
    "choose_multiples_window",
    "choose_window",
    "grid_rounds",
    "grid_rounds_for",
    "load_kernels",
    "msm_g1",
    "msm_g2",
    "ones_segment",
    "window_count",
]


@dataclass
class Multiples:
    """Precomputed multiples of n resident points: ``table`` rows [w n, (w + 1) n) hold
    2^(c w) P_i for w < windows (rows [0, n) are the points themselves)."""

    table: Any
    c: int
    windows: int
    n: int


class PendingMsm:
    """An enqueued MSM: :meth:`result` waits for its result copy and finishes on the host."""

    def __init__(self, g2: bool, host: np.ndarray, nw: int, c: int, marks: _Marks, owner: _Msm) -> None:
        self.g2, self._host, self._nw, self._c, self._marks, self._owner = g2, host, nw, c, marks, owner
        self._result: Any = None
        self.timings: dict[str, float] = {}

    def done(self) -> bool:
        """Whether the device part has finished (never blocks)."""
        return self._result is not None or bool(self._marks.last.done)

    def wait_device(self) -> None:
        """Wait until the device part has finished (the host part is :meth:`result`'s)."""
        self._marks.last.synchronize()

    def result(self) -> G1Point | G2Point:
        """The sum as an arkworks point (waits for this MSM's device work only)."""
        if self._result is None:
            self._marks.last.synchronize()
            t0 = time.perf_counter()
            words = self._host
            self._result = horner(words[: self._nw], self._c, words[self._nw :], self.g2)
            self.timings = self._marks.spans()
            self.timings["finish"] = 1e3 * (time.perf_counter() - t0)
            self._owner.last_timings = self.timings
        return self._result


# ------------------------------------------------------------------ the MSM objects

KERNELS = ("msm_classify", "msm_digits", "msm_accumulate", "msm_reduce",
           "msm_sort_count", "msm_sort_scan", "msm_sort_scatter", "msm_radix_hist", "msm_radix_scatter",
           "msm_ga_rows", "msm_ga_count", "msm_ga_den", "msm_ga_add", "msm_ga_inv", "msm_accumulate_list")


def load_kernels(params: MsmParams, g2: bool) -> dict[str, Any]:
    """The MSM module's kernels for ``params`` and the group (``g2``), by name. CUDA loads a module's
    functions as they are first asked for (~0.5 ms each on an H100: ~8 ms for a module's first MSM
    object), so a key's loader calls this beside its upload (:mod:`.key_load`) and its MSM objects
    find them loaded."""
    mod = get_module(MSM_PATH, params.defines(g2))
    return {name: mod.get_function(name) for name in KERNELS}


class _Msm(_MsmPasses):
    """Pippenger MSM over resident points; subclasses fix the group."""

    G2 = False

    def __init__(self, d_points: Any, params: MsmParams | None = None, multiples: Multiples | None = None) -> None:
        self.params = params or MsmParams()
        self._aw = 24 if self.G2 else 12  # uint64 words per affine point
        self._xw = 2 * self._aw  # per XYZZ point
        self.d_points = _as_rows(d_points, self._aw, f"{type(self).__name__} points")
        self.n = int(self.d_points.shape[0])
        if multiples is not None and (multiples.n != self.n or int(multiples.table.shape[0]) != multiples.n *
                                      multiples.windows or multiples.windows != window_count(multiples.c)):
            raise InputError(f"{type(self).__name__}: a multiples table of {multiples.table.shape[0]} rows "
                             f"(c={multiples.c}, {multiples.windows} windows) does not fit {self.n} points")
        self.multiples = multiples
        self._k = load_kernels(self.params, self.G2)
        # level-1 segments summed at once (the ones' sum sizes its segments by them)
        self._resident = occupancy(self._k["msm_accumulate"], self.params.nthreads)
        self._ga_resident = occupancy(self._k["msm_ga_add"], self.params.nthreads)
        self.last_timings: dict[str, float] = {}
        self._graphs: dict[int, list[_GraphRun]] = {}  # batch size k -> captured dense passes
        self._graph_lock = threading.Lock()

    @property
    def resident_threads(self) -> int | None:
        """Level-1 accumulation threads resident at once on this device: msm_accumulate's (None: not known)."""
        return self._resident

    @property
    def nbytes(self) -> int:
        """Device bytes held between runs (the resident points, or their multiples table)."""
        if self.d_points is None:
            return 0
        return int(self.multiples.table.nbytes) if self.multiples is not None else int(self.d_points.nbytes)

    def close(self) -> None:
        """Drop the references to the points, the multiples and the captured graphs (idempotent)."""
        self.d_points = None
        self.multiples = None
        with self._graph_lock:
            self._graphs = {}

    def _check(self, d_scalars: Any) -> Any:
        if self.d_points is None:
            raise InputError(f"{type(self).__name__}.run after close()")
        scalars = _as_rows(d_scalars, 4, f"{type(self).__name__} scalars")
        if scalars.shape[0] > self.n:
            raise InputError(f"{type(self).__name__}: {scalars.shape[0]} scalars for {self.n} points")
        return scalars

    def run(self, d_scalars: Any, *, stream: Any = None) -> G1Point | G2Point:
        """sum_i scalars[i] * points[i] for the first m = len(scalars) points.

        ``d_scalars``: ``(m, 4)`` uint64 standard form (device or host), m <= n.
        Classifies, enqueues and waits on ``stream`` (default: the current stream).
        """
        scalars = self._check(d_scalars)
        with stream if stream is not None else contextlib.nullcontext():
            plan = classify(scalars, self.params.nthreads)
            return self.launch(scalars, plan).result()

    def launch(self, d_scalars: Any, plan: ScalarPlan, stream: Any = None) -> PendingMsm:
        """Enqueue the MSM of ``d_scalars`` (device, (m, 4), m <= n) with its plan on
        ``stream`` (default: the current one); no host sync."""
        return self.launch_batch([d_scalars], [plan], stream)[0]

    def launch_batch(self, d_scalars: list[Any], plans: list[ScalarPlan], stream: Any = None) -> list[PendingMsm]:
        """Enqueue the MSMs of k scalar vectors over these points as ONE Pippenger pass (one
        digit pass, one sort, one accumulation, one reduction; each vector keeps its own buckets)
        on ``stream``: k proofs' MSMs of one key section cost the launches and host calls of
        one. With k > 1 every vector must have the same length and a dense plan (no 0/1 split:
        zeros and ones go through the windows like any scalar). A batch whose sort keys would
        not fit 32 bits is split. Dense passes run as CUDA graphs where ``params.graphs`` and
        their size allow (:data:`.msm_params.GRAPH_MAX_ENTRIES`). No host sync."""
        if len(d_scalars) != len(plans) or not plans:
            raise InputError(f"{type(self).__name__}: {len(d_scalars)} scalar vectors for {len(plans)} plans")
        vecs = [self._check(v) for v in d_scalars]
        for v, plan in zip(vecs, plans):
            if plan.m != v.shape[0]:
                raise InputError(f"{type(self).__name__}: a plan of {plan.m} scalars for {v.shape[0]}")
        if len(vecs) > 1 and (any(p.other is not None for p in plans) or len({int(v.shape[0]) for v in vecs}) > 1):
            raise InputError(f"{type(self).__name__}: a batch of MSMs needs dense plans of one length")
        with stream if stream is not None else contextlib.nullcontext():
            if len(vecs) == 1 and plans[0].other is not None:
                return [self._launch_one(vecs[0], plans[0])]
            fit = self._batch_fit(int(vecs[0].shape[0]))
            out: list[PendingMsm] = []
            for lo in range(0, len(vecs), fit):
                out += self._launch_dense(vecs[lo : lo + fit])
            return out

    def _launch_one(self, scalars: Any, plan: ScalarPlan) -> PendingMsm:
        s = cupy.cuda.get_current_stream()
        marks = _Marks(s)
        parts = []
        if plan.n1:
            parts.append(self._sum_ones(plan.ones, plan.n1))
        marks.mark("ones")
        nw, c = 0, 0
        if plan.n2:
            wsums, c = self._pippenger(scalars, plan.other, plan.n2, plan.n2, marks, plan.sorts)
            nw = int(wsums.shape[1])
            parts = [wsums[0], *parts]
        host = np.zeros((sum(int(p.shape[0]) for p in parts), self._xw), dtype=np.uint64)
        if parts:
            host = _pinned_like(host)
            _copy_to_host_async(cupy.concatenate(parts) if len(parts) > 1 else parts[0], host, s)
        marks.mark("d2h")
        return PendingMsm(self.G2, host, nw, c, marks, self)

    def _launch_dense(self, vecs: list[Any]) -> list[PendingMsm]:
        """k dense MSMs of m scalars each as one pass over their concatenation."""
        s = cupy.cuda.get_current_stream()
        marks = _Marks(s)
        k, m = len(vecs), int(vecs[0].shape[0])
        marks.mark("ones")
        if m == 0:
            host = np.zeros((k, 0, self._xw), dtype=np.uint64)
            marks.mark("d2h")
            return [PendingMsm(self.G2, host[j], 0, 0, marks, self) for j in range(k)]
        run = self._graph_run(k, m)
        if run is None:
            scalars = cupy.concatenate(vecs) if k > 1 else vecs[0]
            wsums, c = self._pippenger(scalars, None, k * m, m, marks)
        else:
            for j, v in enumerate(vecs):
                _copy_device_async(v, run.d_in[j * m : (j + 1) * m], s)
            run.graph.launch(s)
            marks.mark("graph")
            wsums, c = run.wsums, run.c
        host = _pinned_like(np.zeros(wsums.shape, dtype=np.uint64))
        _copy_to_host_async(wsums, host, s)
        marks.mark("d2h")
        if run is not None:
            with self._graph_lock:
                run.free, run.busy = marks.last, False
        return [PendingMsm(self.G2, host[j], int(wsums.shape[1]), c, marks, self) for j in range(k)]

    def _graph_run(self, k: int, m: int) -> _GraphRun | None:
        """A captured dense pass of k x m scalars whose last run is over, marked busy, else a new
        capture while this object holds fewer than :data:`.msm_params.GRAPH_RUNS` graphs; None where
        graphs are off, the pass is too large for one (:func:`.msm_params.graph_batch_limit`), or no
        graph is free and no more may be made (the pass then runs without one: waiting for a graph
        would serialise MSMs that may overlap on the device)."""
        if not self.params.graphs or not graphs_supported():
            return None
        if k > graph_batch_limit(m, self._window_bits(m)):
            return None
        with self._graph_lock:
            runs = self._graphs.setdefault(k, [])
            done = [r for r in runs if not r.busy and (r.free is None or r.free.done)]
            if done:
                done[0].busy = True
                return done[0]
            if sum(len(r) for r in self._graphs.values()) >= GRAPH_RUNS:
                return None
        run = _GraphRun.capture(self, k, m)
        run.busy = True
        with self._graph_lock:
            self._graphs.setdefault(k, []).append(run)  # (close() may have emptied the dict meanwhile)
        return run

    def sort_signature(self, n2: int, per: int | None = None) -> tuple[int, int, int]:
        """(window bits c, windows per sort batch, window bits in a key) of a pass over n2 tail
        scalars (``per`` of them per MSM; default n2): MSMs over the same scalars whose
        signatures are equal make the same sort keys (see :class:`SharedSorts`)."""
        c = self._window_bits(n2 if per is None else per)
        per_batch = max(1, min(window_count(c), self.params.max_entries // n2))
        wb = max(1, (per_batch - 1).bit_length()) if self.multiples is not None else 0
        return c, per_batch, wb

    def _window_bits(self, n2: int) -> int:
        mul = self.multiples
        return mul.c if mul is not None else self.params.window_bits or choose_window(n2)

    def _batch_fit(self, m: int) -> int:
        """The most MSMs of m scalars one dense pass takes: their sort keys (digits.cuh) must stay
        below MSM_KEY_NONE = 2^32 - 1 for every window batch."""
        c = self._window_bits(m)
        if self.multiples is not None:  # key < (k 2^(c-1)) << (1 + wb), wb <= bits of the window count
            return max(1, ((1 << 32) - 1) >> (c + max(1, (window_count(c) - 1).bit_length())))
        return max(1, ((1 << 32) - 1) // (window_count(c) << c))  # key < (k nw) << c

    # ---- 0/1 split
    def _sum_ones(self, ones: Any, n1: int) -> Any:
        """Sum of the points whose scalar is 1: one bucket of the accumulation kernel, in
        segments sized by :func:`ones_segment` (whole waves of resident threads)."""
        keys = cupy.zeros(n1, dtype=np.uint32)  # window 0, bucket 0, positive
        seg = ones_segment(n1, self._resident, self.params.seg)
        return self._accumulate(cupy.arange(n1, dtype=np.int64), keys, ones, n1, n1, 1, 1, self.d_points, 0, n1,
                                seg, grid=False)

    # ---- Pippenger on the rest
    def _pippenger(self, scalars: Any, idx: Any, n2: int, per: int, marks: _Marks,
                   sorts: SharedSorts | None = None) -> tuple[Any, int]:
        """Window sums ``(k, windows, xw)`` of the k = n2 / per MSMs of ``scalars`` (``per``
        scalars each; k = 1 with an index list), for Horner with window bits c: (sums, c).
        With precomputed multiples each MSM has one "window" (its shared bucket set's sum).
        ``sorts``: where the sorted keys of these scalars are shared with other MSMs."""
        mul = self.multiples
        k = n2 // per
        c, per_batch, wb = self.sort_signature(n2, per)
        nw_total = window_count(c)
        cfg = c | wb << 8
        shared: Any = None  # with multiples: the one bucket set of every window (per MSM)
        wsums: Any = cupy.empty((k, nw_total, self._xw), dtype=np.uint64)  # without: a sum per window
        nb = 1 << (c - 1)
        for w0 in range(0, nw_total, per_batch):
            nw = min(per_batch, nw_total - w0)
            skey = (c, per_batch, wb, w0, nw, n2, per, _address(scalars), _address(idx))
            made = sorts.take(skey) if sorts is not None else None
            if made is None:
                keys = cupy.empty(nw * n2 + 1, dtype=np.uint32)  # + 1: the counting sort's sentinel
                self._launch("msm_digits", n2, scalars, _NULL if idx is None else idx, keys, _u64(n2),
                             _u32(w0), _u32(nw), _u32(cfg), _u64(per))
                marks.mark("digits")
                perm = self._sort(keys, nw * n2, k * nb * (1 if mul is not None else nw), cfg)
                if sorts is not None:
                    sorts.put(skey, keys, perm)
            else:
                keys, perm = made
                marks.mark("digits")
            marks.mark("sort")
            if mul is None:
                buckets = self._accumulate(perm, keys, idx, nw * n2, n2, cfg, k * nw * nb, self.d_points, 0, per,
                                           marks=marks)
            else:
                buckets = self._accumulate(perm, keys, idx, nw * n2, n2, cfg, k * nb, mul.table[w0 * mul.n :],
                                           mul.n, per, marks=marks)
            marks.mark("accumulate")
            if sorts is not None:
                sorts.done(skey)
            if mul is None:
                dst = wsums[:, w0 : w0 + nw]
                if dst.flags.c_contiguous:  # one MSM, or all its windows at once: the sums go straight in
                    self._window_sums(buckets, k * nw, c, out=dst.reshape(k * nw, self._xw))
                else:  # a CuPy slice copy: an elementwise kernel compiled at run time (NVRTC: ~20 ms of a
                    # one-shot process), only where several MSMs' windows are split across batches
                    dst[...] = self._window_sums(buckets, k * nw, c).reshape(k, nw, self._xw)
            elif shared is None:
                shared = buckets
            else:
                self._launch("msm_reduce", k * nb, _u32(OP_ADD), buckets, _NULL, _NULL, shared, _NULL,
                             _u64(k * nb), _u32(0), _u32(0))
            marks.mark("reduce")
        if mul is not None:
            return self._window_sums(shared, k, c).reshape(k, 1, self._xw), c
        return wsums, c


class MsmG1(_Msm):
    """G1 MSM over resident ``(n, 12)`` zkey-layout points."""

    G2 = False

    def run(self, d_scalars: Any, *, stream: Any = None) -> G1Point:
        result = super().run(d_scalars, stream=stream)
        assert isinstance(result, G1Point)
        return result


class MsmG2(_Msm):
    """G2 MSM over resident ``(n, 24)`` zkey-layout points."""

    G2 = True

    def run(self, d_scalars: Any, *, stream: Any = None) -> G2Point:
        result = super().run(d_scalars, stream=stream)
        assert isinstance(result, G2Point)
        return result


def _one_shot(cls: type[_Msm], points: Any, scalars: Any) -> G1Point | G2Point:
    if points.shape[0] != scalars.shape[0]:
        raise InputError(f"MSM size mismatch: {points.shape[0]} points, {scalars.shape[0]} scalars")
    m = cls(points)
    try:
        return m.run(scalars)
    finally:
        m.close()


def msm_g1(points: Any, scalars: Any) -> G1Point:
    """One-shot G1 MSM (points and scalars on the host or the device; counts must match)."""
    return _one_shot(MsmG1, points, scalars)  # type: ignore[return-value]


def msm_g2(points: Any, scalars: Any) -> G2Point:
    """One-shot G2 MSM (points and scalars on the host or the device; counts must match)."""
    return _one_shot(MsmG2, points, scalars)  # type: ignore[return-value]
