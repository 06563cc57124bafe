"""Multi-scalar multiplication on the GPU over G1 and G2 (Pippenger, signed digits, 0/1 split).

Device state: an :class:`MsmG1` / :class:`MsmG2` holds its resident point array
(zkey layout, ``(n, 12)`` / ``(n, 24)`` uint64, Montgomery coordinates,
infinity = all zeros), optionally the precomputed multiples 2^(c w) P of every
point (:class:`Multiples`), and the kernels of ``kernels/msm/msm.cu``; every
other buffer lives only for one run (CuPy's stream-ordered pool recycles them).

One run, for m standard-form scalars (``(m, 4)`` uint64, each < 2^255):

1. A :class:`ScalarPlan` says which scalars are 0, 1 or other: :func:`classify`
   (``msm_classify``; it waits for the device, so the prover does it once per
   partition while staging: A, B1, B2 and C share the witness, and
   :meth:`ScalarPlan.tail` gives C's part without a wait) or
   :func:`dense_plan` (every scalar "other": the H values).
2. Zeros are dropped. The points whose scalar is 1 are summed by the
   accumulation kernel as ONE bucket (one mixed addition per point, in
   load-balanced segments) instead of ~W additions in Pippenger (supraseal's
   batch-add split for boolean-heavy witnesses).
3. The other scalars go through Pippenger with c-bit signed windows
   (W = ceil(256 / c)): ``msm_digits`` writes one sort key per (window,
   scalar), a counting sort by bucket (``msm_sort_*``, three launches, no host wait) orders
   them when the batch has at most :data:`COUNTING_SORT_BINS` buckets, else a stable LSD radix
   sort over the bits the batch's keys use (``msm_radix_*``, two launches and a scan a pass of
   at most 9 bits, no host wait),
   ``msm_accumulate`` adds each run of a bucket with segmented, load-balanced
   threads (or ``msm_accumulate_affine``, ``MsmParams.ba_rounds`` > 0: the same
   segments summed by batch-affine rounds, one inversion per block and round,
   then XYZZ; or for G2 with ``MsmParams.g2_split``, ``msm_accumulate_split``: each
   segment summed by a pair of lanes, one Fq2 component each), ``msm_reduce``
   combines runs that cross segments and reduces buckets to window sums.
   Windows are processed in batches so at most
   ``MsmParams.max_entries`` keys exist at once. With precomputed multiples
   every window adds the multiple 2^(c w) P_i into ONE shared bucket set, so
   the reduction runs once instead of W times and larger windows pay
   (:func:`choose_multiples_window`).
4. The window sums and the ones' sum are copied into pinned host memory on the
   same stream; :meth:`PendingMsm.result` waits for that copy alone, turns them
   into arkworks points and Horner-combines them on the host (:func:`horner`).

:meth:`_Msm.launch` enqueues all of it on a stream without waiting for the
device, so the caller can enqueue more work, on this stream or another, before
it collects any result.

CUDA graphs (``MsmParams.graphs``, small MSMs): a dense pass whose sort keys number at most
:data:`.msm_params.GRAPH_MAX_ENTRIES` is captured once per batch size into a graph that owns its buffers
(:class:`_GraphRun`); each run copies the scalars into the graph's input, launches the graph
(one call instead of ~20 launches and allocations) and copies the window sums back. A small
MSM's kernels take tens of microseconds each, so the host's launches, not the device, set the
latency of a lone small proof without them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from ...algebra.curve import g1_to_ark, g2_to_ark
from ...algebra.field import Q_MOD, fq2_inv_int, fq2_mul_int, limbs_to_ints
from ...errors import InputError
from .env_knobs import GA_INV_FAN, GA_THREADS, accumulate_rounds, grid_rounds
from .knobs import MSM_PATH
from .msm_geometry import choose_multiples_window, choose_window, grid_rounds_for, ones_segment, window_count
from .msm_params import GRAPH_RUNS, MsmParams, graph_batch_limit
from .modules import get_module, occupancy

__all__ = [
    "MSM_PATH",
    "NON_CANONICAL",
    "MsmG1",
    "MsmG2",
    "MsmParams",
    "Multiples",
    "PendingMsm",
    "ScalarPlan",
    "SharedSorts",
    "accumulate_rounds",
    "choose_multiples_window",
    "choose_window",
    "check_canonical",
    "classify",
    "dense_plan",
    "grid_rounds",
    "grid_rounds_for",
    "horner",
    "msm_g1",
    "msm_g2",
    "ones_segment",
    "point_from_xyzz",
    "support_rows",
    "window_count",
]

OP_COMBINE, OP_BUCKETS, OP_GROUPS, OP_ADD = 0, 1, 2, 3  # msm_reduce ops (msm.cu)
_NULL = np.uint64(0)  # a null device pointer argument
_D2H, _D2D = 2, 3  # cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice
# A window batch with at most this many buckets is ordered by the counting sort (sort.cuh): its
# one-block scan walks the counters in ranges of bins / SCAN_THREADS, so far larger bucket sets
# (2^24-point MSMs without multiples) keep the radix sort.
COUNTING_SORT_BINS = 1 << 20
# The radix sort's launch geometry (MSM_RADIX_THREADS x MSM_RADIX_ITEMS keys a tile, digits of at
# most MSM_RADIX_MAX_BITS bits: kernels/msm/sort.cuh).
RADIX_THREADS = 256
RADIX_TILE = RADIX_THREADS * 16
RADIX_MAX_BITS = 9
SCAN_THREADS = 512  # msm_sort_scan's largest block (MSM_SCAN_THREADS in msm.cu)
_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (see _GraphRun.capture)


# ------------------------------------------------------------------ result conversion


def point_from_xyzz(words: np.ndarray, g2: bool) -> G1Point | G2Point:
    """An XYZZ point as stored by the kernels (Montgomery limbs) -> arkworks point.

    ``words``: 24 uint64 (G1: X, Y, ZZ, ZZZ) or 48 (G2, each coordinate c0, c1);
    ZZ = 0 is infinity. x = X / ZZ, y = Y / ZZZ with Python ints, straight on the
    Montgomery values (the factors R cancel), with one inversion for both
    denominators (1/ZZ = ZZZ / (ZZ ZZZ), 1/ZZZ = ZZ / (ZZ ZZZ)).
    """
    vals = limbs_to_ints(np.asarray(words, dtype=np.uint64).reshape(-1, 6))
    if not g2:
        X, Y, ZZ, ZZZ = vals
        if ZZ % Q_MOD == 0:
            return G1Point.identity()
        t = pow(ZZ * ZZZ, -1, Q_MOD)
        return g1_to_ark((X * ZZZ * t % Q_MOD, Y * ZZ * t % Q_MOD))
    X2, Y2, ZZ2, ZZZ2 = ((vals[i], vals[i + 1]) for i in range(0, 8, 2))
    if ZZ2[0] % Q_MOD == 0 and ZZ2[1] % Q_MOD == 0:
        return G2Point.identity()
    t2 = fq2_inv_int(fq2_mul_int(ZZ2, ZZZ2))
    return g2_to_ark((fq2_mul_int(X2, fq2_mul_int(ZZZ2, t2)), fq2_mul_int(Y2, fq2_mul_int(ZZ2, t2))))


def horner(wsums: np.ndarray, c: int, extra: np.ndarray, g2: bool) -> G1Point | G2Point:
    """sum_w 2^(c w) wsums[w] + sum(extra) on the host (arkworks), XYZZ rows in.

    The doubling chain of the windows is c (W - 1) long whatever the parallelism;
    arkworks does it in ~1 ms where one GPU thread took ~9.5 ms (G2, c = 20).
    """
    acc = (G2Point if g2 else G1Point).identity()
    step = Scalar(1 << c)
    for w in range(wsums.shape[0] - 1, -1, -1):
        acc = acc * step + point_from_xyzz(wsums[w], g2)
    for row in extra:
        acc = acc + point_from_xyzz(row, g2)
    return acc


# ------------------------------------------------------------------ scalar plans


@dataclass
class ScalarPlan:
    """Which of m scalars are 0, 1 or other (device index lists, ascending).

    ``ones`` / ``other``: int64 device arrays of the rows equal to 1 / of the other
    non-zero rows; ``other`` None means every row is "other" (a dense plan, no
    index list). ``cuts`` maps an offset k to (ones, others) among rows < k, so
    :meth:`tail` needs no host sync for those offsets.
    """

    m: int
    n1: int
    n2: int
    ones: Any
    other: Any
    cuts: dict[int, tuple[int, int]] = field(default_factory=dict)
    sorts: SharedSorts | None = None  # the sorted digits, shared by the MSMs of these scalars
    # name -> the plan of the same scalars over the rows a support keeps (see classify)
    subsets: dict[str, ScalarPlan] = field(default_factory=dict)
    # the (m, 4) scalars this plan is over when they are a packed copy of the classified vector
    # (a support's rows, in order: what the MSMs of a packed section take), else None
    scalars: Any = None

    def tail(self, k: int) -> ScalarPlan:
        """The plan of ``scalars[k:]`` (index arithmetic enqueued on the current stream; a host
        sync only for an offset that is not in ``cuts``)."""
        if k == 0:
            return self
        if not 0 <= k <= self.m:
            raise InputError(f"scalar offset {k} outside 0 .. {self.m}")
        if self.other is None:  # dense: every row is "other", none is 1
            return dense_plan(self.m - k)
        if k not in self.cuts:
            self.cuts[k] = (_count_below(self.ones, k), _count_below(self.other, k))
        j1, j2 = self.cuts[k]
        shift = np.int64(k)
        ones = self.ones[j1:] - shift if self.n1 > j1 else None
        return ScalarPlan(self.m - k, self.n1 - j1, self.n2 - j2, ones, self.other[j2:] - shift)


@dataclass
class _SortEntry:
    """One shared window batch: its keys and their order, the stream and event that made them,
    and how many users are still to come."""

    keys: Any
    perm: Any
    stream: Any
    made: Any
    left: int


class SharedSorts:
    """The sorted digit keys of one plan's scalars, made once for the MSMs that share them.

    A partition's A, B1 and B2 MSMs take the same scalars (w) and, with one window size, the
    same sort keys (digits.cuh: a key holds the digit and the window, never the point), so the
    digit pass and the sort of each window batch run once and the other sections reuse them.
    An entry is keyed by the sort signature (:meth:`_Msm.sort_signature`), the window batch and
    the scalars; ``users`` says how many MSMs will ask for a signature: after that many an entry
    is dropped, so its memory goes back to the pool as soon as the last one is enqueued. A user
    on another stream than the one that made the entry waits for it on the device (an event),
    and the maker's stream waits for that user's accumulation before the entry can be freed,
    since CuPy's pool reuses freed memory in the order of the stream that allocated it.
    """

    def __init__(self, users: dict[tuple[int, int, int], int]) -> None:
        self.users = users  # sort signature (_Msm.sort_signature) -> MSMs that will ask for it
        self._entries: dict[tuple[int, ...], _SortEntry] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_msms(cls, msms: list[Any], n2: int) -> SharedSorts:
        """The sharing of the MSMs ``msms`` over the same n2 tail scalars: users per signature,
        counting only passes that sort all their windows in one batch (an entry then holds what
        one MSM held anyway; a batched pass would keep every batch's keys alive at once: shared in
        two batches at 2^27 PoRep-like, the H200's device stage stayed at 2.25 s a partition while
        its peak device memory rose from 113 to 120 GiB)."""
        users: dict[tuple[int, int, int], int] = {}
        if n2 <= 0:  # every scalar 0 or 1 (a boolean witness): no pass sorts anything
            return cls(users)
        for m in msms:
            sig = m.sort_signature(n2)
            if sig[1] >= window_count(sig[0]):
                users[sig] = users.get(sig, 0) + 1
        return cls(users)

    def take(self, key: tuple[int, ...]) -> tuple[Any, Any] | None:
        """(keys, perm) of an entry made before, with this stream ordered after its making; None
        when there is none (the caller makes it and :meth:`put` s it)."""
        with self._lock:
            e = self._entries.get(key)
        if e is None:
            return None
        s = cupy.cuda.get_current_stream()
        if s.ptr != e.stream.ptr:
            s.wait_event(e.made)
        return e.keys, e.perm

    def put(self, key: tuple[int, ...], keys: Any, perm: Any) -> None:
        """Keep a freshly made (keys, perm) for the other users (nothing kept with one user)."""
        users = self.users.get(key[:3], 1)
        if users < 2:
            return
        s = cupy.cuda.get_current_stream()
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(s)
        with self._lock:
            self._entries[key] = _SortEntry(keys, perm, s, ev, users)

    def done(self, key: tuple[int, ...]) -> None:
        """One user's accumulation is enqueued: order the maker's stream after it (another
        stream's user), and drop the entry after its last user."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return
            s = cupy.cuda.get_current_stream()
            if s.ptr != e.stream.ptr:
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(s)
                e.stream.wait_event(ev)
            e.left -= 1
            if e.left <= 0:
                del self._entries[key]


def _count_below(idx: Any, k: int) -> int:
    return 0 if idx is None or int(idx.shape[0]) == 0 else int(cupy.searchsorted(idx, k))


def dense_plan(m: int) -> ScalarPlan:
    """Every scalar "other", in order (the H values: no 0/1 split, no index list)."""
    return ScalarPlan(m, 0, m, None, None)


NON_CANONICAL = "MSM scalars: a row has bit 255 set (expected canonical standard-form Fr elements)"


def _classify_rows(scalars: Any, nthreads: int) -> tuple[Any, Any]:
    """``msm_classify`` on the current stream: (per-row class 0 / 1 / 2 as uint8, a uint32[1] flag
    set when some row has bit 255 set), both on the device, nothing waited for."""
    m = int(scalars.shape[0])
    kernel = get_module(MSM_PATH, MsmParams().defines(False)).get_function("msm_classify")
    cls = cupy.empty(m, dtype=np.uint8)
    flag = cupy.zeros(1, dtype=np.uint32)
    if m:
        kernel((-(-m // nthreads),), (nthreads,), (scalars, cls, flag, np.uint64(m)))
    return cls, flag


def check_canonical(scalars: Any, stream: Any, nthreads: int = 128) -> np.ndarray:
    """Enqueue on ``stream`` the check :func:`classify` makes (no scalar has bit 255 set) without
    waiting: returns a pinned uint32[1] that holds nonzero once the stream reaches this point if
    some scalar fails (read it after a later event of that stream; :data:`NON_CANONICAL` says why)."""
    _, flag = _classify_rows(scalars, nthreads)
    host = _pinned_like(np.zeros(1, dtype=np.uint32))
    _copy_to_host_async(flag, host, stream)
    return host


def support_rows(d_points: Any) -> Any:
    """The ascending int32 device list of the rows of ``(n, words)`` points that are not the point
    at infinity (the zkey's all-zero rows). Why: a proving key's B points are infinity for every
    wire that no constraint's B side uses (55 % of the PoRep-like circuit's wires; Filecoin's
    circuit has 1.0 B entries a row), and an MSM entry whose point is infinity costs its lane as
    much as any other (the warp runs its neighbours' additions) and its point the memory of any
    other, so such a section keeps only these rows' points and its MSMs take only these rows'
    scalars (bellperson's density split)."""
    return cupy.flatnonzero(d_points.any(axis=1)).astype(np.int32)


def classify(scalars: Any, nthreads: int = 128, cuts: tuple[int, ...] = (),
             supports: dict[str, Any] | None = None) -> ScalarPlan:
    """The 0/1/other plan of ``(m, 4)`` device scalars on the current stream (waits for it:
    the index lists' lengths and the counts come back to the host).

    Raises InputError when a scalar has bit 255 set (not a canonical Fr element).
    ``cuts``: offsets whose :meth:`ScalarPlan.tail` is precomputed in the same sync.
    ``supports``: name -> ascending device row list (:func:`support_rows`, rows < m); the plan's
    ``subsets[name]`` is then the plan of those rows' scalars, packed: its ``scalars`` are
    ``scalars[rows]`` and its index lists count in that packed order.
    """
    m = int(scalars.shape[0])
    cls, flag = _classify_rows(scalars, nthreads)
    ones = cupy.flatnonzero(cls == 1)
    other = cupy.flatnonzero(cls == 2)
    ks = [k for k in cuts if 0 < k <= m]
    head = [cupy.count_nonzero(cls[:k] == v) for k in ks for v in (1, 2)]
    vals = [int(v) for v in cupy.asnumpy(cupy.stack([flag[0].astype(np.int64)] + head))] if head else \
        [int(cupy.asnumpy(flag)[0])]
    if vals[0]:
        raise InputError(NON_CANONICAL)
    subsets: dict[str, ScalarPlan] = {}
    for name, rows in (supports or {}).items():
        k = int(rows.shape[0])
        if k > m:
            raise InputError(f"support {name!r} keeps {k} rows of {m} scalars")
        kept = cls[rows]  # the classes in packed order
        ones_s, other_s = cupy.flatnonzero(kept == 1), cupy.flatnonzero(kept == 2)
        subsets[name] = ScalarPlan(k, int(ones_s.shape[0]), int(other_s.shape[0]), ones_s, other_s,
                                   scalars=scalars[rows])
        del kept
    plan = ScalarPlan(m, int(ones.shape[0]), int(other.shape[0]), ones, other, subsets=subsets)
    plan.cuts = {k: (vals[1 + 2 * i], vals[2 + 2 * i]) for i, k in enumerate(ks)}
    return plan


# ------------------------------------------------------------------ helpers


class _Marks:
    """CUDA events on one stream; ms per named span (repeated names add up)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.marks: list[tuple[str, Any]] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        ev = cupy.cuda.Event()
        ev.record(self.stream)
        self.marks.append((name, ev))

    @property
    def last(self) -> Any:
        return self.marks[-1][1]

    def spans(self) -> dict[str, float]:
        self.last.synchronize()
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + float(cupy.cuda.get_elapsed_time(a, b))
        out["total"] = float(cupy.cuda.get_elapsed_time(self.marks[0][1], self.last))
        return out


class _NoMarks(_Marks):
    """Marks that record nothing: a pass being captured into a graph (events recorded inside a
    capture are not timing events)."""

    def __init__(self) -> None:
        self.marks = []

    def mark(self, name: str) -> None:
        return None


@dataclass
class _GraphRun:
    """A dense pass of k MSMs of m scalars captured into a CUDA graph, with the buffers it owns:
    ``d_in`` (the k m scalars, copied in before each launch) and ``wsums`` (its output); every
    buffer the pass allocates while captured stays alive in ``held`` as long as the graph does.
    ``free``: the event after the last run's copy of ``wsums`` (None: never run); ``busy``: a
    launch has taken it and not yet recorded that event."""

    graph: Any
    d_in: Any
    wsums: Any
    c: int
    held: list[Any]
    free: Any = None
    busy: bool = False

    @classmethod
    def capture(cls, msm: _Msm, k: int, m: int) -> _GraphRun:
        """Capture ``msm``'s dense pass over k x m scalars on a private stream (relaxed mode, so
        the memory pool may grow meanwhile; its allocations are recorded and kept)."""
        held: list[Any] = []
        pool = cupy.get_default_memory_pool()

        def alloc(size: int) -> Any:
            mem = pool.malloc(size)
            held.append(mem)
            return mem

        d_in = cupy.zeros((k * m, 4), dtype=np.uint64)
        cs = cupy.cuda.Stream(non_blocking=True)
        with _CAPTURE_LOCK, cupy.cuda.using_allocator(alloc), cs:
            cs.begin_capture()
            try:
                wsums, c = msm._pippenger(d_in, None, k * m, m, _NoMarks())
            finally:
                graph = cs.end_capture()
        return cls(graph, d_in, wsums, c, held)


def scan_threads(bins: int) -> int:
    """msm_sort_scan's block for ``bins`` counters: ~16 counters per thread, a multiple of 32 from
    32 to SCAN_THREADS (a few thousand buckets need no 512 threads; nor does the emulator, whose
    block runs as fibers)."""
    return min(SCAN_THREADS, max(32, -(-bins // (16 * 32)) * 32))


def graphs_supported() -> bool:
    """Whether this CuPy can capture CUDA graphs (not on HIP, nor on a stand-in without streams
    that capture)."""
    runtime = getattr(cupy.cuda, "runtime", None)
    return hasattr(cupy.cuda.Stream, "begin_capture") and not getattr(runtime, "is_hip", False)


def _as_rows(a: Any, width: int, what: str) -> Any:
    """A C-contiguous ``(n, width)`` uint64 device array (uploads a host array)."""
    d = cupy.ascontiguousarray(cupy.asarray(a))
    if d.dtype != np.uint64 or d.ndim != 2 or d.shape[1] != width:
        raise InputError(f"{what}: expected an (n, {width}) uint64 array, got {d.dtype} {tuple(d.shape)}")
    return d


def _address(a: Any) -> int:
    """Where an array's data starts (0 for None): a device pointer, or a host one under a CPU
    stand-in for CuPy whose arrays are numpy's."""
    if a is None:
        return 0
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def _u32(x: int) -> np.uint32:
    return np.uint32(x)


def _u64(x: int) -> np.uint64:
    return np.uint64(x)


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


class _Msm:
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
        mod = get_module(MSM_PATH, self.params.defines(self.G2))
        self._k = {name: mod.get_function(name) for name in
                   ("msm_classify", "msm_digits", "msm_accumulate", "msm_accumulate_affine", "msm_reduce",
                    "msm_sort_count", "msm_sort_scan", "msm_sort_scatter", "msm_radix_hist", "msm_radix_scatter",
                    "msm_ga_rows", "msm_ga_count",
                    "msm_ga_den", "msm_ga_add", "msm_ga_inv", "msm_accumulate_list")}
        self._split = self.params.split(self.G2)  # level 1 by lane pairs (msm_accumulate_split, G2 modules only)
        if self._split:
            self._k["msm_accumulate_split"] = mod.get_function("msm_accumulate_split")
        self._resident = occupancy(self._k["msm_accumulate_split" if self._split else "msm_accumulate"],
                                   self.params.nthreads)
        # level-1 segments summed at once (the ones' sum sizes its segments by them): one a pair when split
        self._segments = self._resident // 2 if self._split and self._resident else self._resident
        self._ba_resident = occupancy(self._k["msm_accumulate_affine"], self.params.nthreads)
        self._ga_resident = occupancy(self._k["msm_ga_add"], self.params.nthreads)
        self.last_timings: dict[str, float] = {}
        self._graphs: dict[int, list[_GraphRun]] = {}  # batch size k -> captured dense passes
        self._graph_lock = threading.Lock()

    @property
    def resident_threads(self) -> int | None:
        """Level-1 accumulation threads resident at once on this device: msm_accumulate's, or
        msm_accumulate_split's (two a segment) where ``params.g2_split`` applies (None: not known)."""
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

    def _launch(self, name: str, threads: int, *args: Any) -> None:
        block = self.params.nthreads
        self._k[name]((max(1, -(-threads // block)),), (block,), args)

    # ---- 0/1 split
    def _sum_ones(self, ones: Any, n1: int) -> Any:
        """Sum of the points whose scalar is 1: one bucket of the accumulation kernel, in
        segments sized by :func:`ones_segment` (whole waves of resident threads)."""
        keys = cupy.zeros(n1, dtype=np.uint32)  # window 0, bucket 0, positive
        seg = None if self.params.ba_rounds else ones_segment(n1, self._segments, self.params.seg)
        return self._accumulate(cupy.arange(n1, dtype=np.int64), keys, ones, n1, n1, 1, 1, self.d_points, 0, n1,
                                seg, grid=False)

    def _sum_blocks(self, arr: Any, blocks: int, per: int) -> Any:
        """Sum each run of ``per`` consecutive XYZZ points: ``(blocks, xw)``.

        With blocks > 1, ``per`` and ``params.group`` are powers of two, so no
        group straddles two blocks.
        """
        while per > 1:
            g = min(self.params.group, per)
            new_per = -(-per // g)
            out = cupy.empty((blocks * new_per, self._xw), dtype=np.uint64)
            self._launch("msm_reduce", blocks * new_per, _u32(OP_GROUPS), arr, _NULL, _NULL, out, _NULL,
                         _u64(blocks * per), _u32(g), _u32(0))
            arr, per = out, new_per
        return arr

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
                wsums[:, w0 : w0 + nw] = self._window_sums(buckets, k * nw, c).reshape(k, nw, self._xw)
            elif shared is None:
                shared = buckets
            else:
                self._launch("msm_reduce", k * nb, _u32(OP_ADD), buckets, _NULL, _NULL, shared, _NULL,
                             _u64(k * nb), _u32(0), _u32(0))
            marks.mark("reduce")
        if mul is not None:
            return self._window_sums(shared, k, c).reshape(k, 1, self._xw), c
        return wsums, c

    def _sort(self, keys: Any, n: int, bins: int, cfg: int) -> Any:
        """Positions of the n keys (``keys`` holds n + 1: the last is scratch) ordered by bucket
        (``bins`` buckets; zero digits last): the counting sort (sort.cuh) up to
        :data:`COUNTING_SORT_BINS` buckets, else the radix sort over the bits the keys use (or
        ``cupy.argsort``, ``params.large_sort``)."""
        if bins > COUNTING_SORT_BINS:
            if self.params.large_sort == "argsort":
                return cupy.argsort(keys[:n])
            # a key is bucket << (1 + wb) | low bits < bins << (1 + wb): sorting one bit more puts
            # MSM_KEY_NONE (every bit set) after every real key
            return self._radix_sort(keys, n, (bins << (1 + ((cfg >> 8) & 0xFF))).bit_length())
        counts = cupy.zeros(bins, dtype=np.uint32)
        perm = cupy.empty(n, dtype=np.int64)
        self._launch("msm_sort_count", n, keys, counts, perm, _u64(n), _u32(cfg))
        self._k["msm_sort_scan"]((1,), (scan_threads(bins),), (counts, _u64(bins)))
        self._launch("msm_sort_scatter", n, keys, counts, perm, _u64(n), _u32(cfg))
        return perm

    def _radix_sort(self, keys: Any, n: int, bits: int) -> Any:
        """The stable LSD radix sort of sort.cuh: int64 positions of ``keys[:n]`` by their low
        ``bits`` bits, in passes of at most :data:`RADIX_MAX_BITS`; no host wait.

        Why not ``cupy.argsort``: it waits for the host inside every MSM, so a prover's two
        partitions in flight feed the device in turns. Measured on the H200 (perf/results/
        gpu-msm-radix-sort-h200.json): the sort phase alone is slower (2^27 H-shaped MSM 76.2 ms
        against 68.4), the 2^27 pipeline faster (1.901 s a partition against 1.958). Ranked by
        warps (one match a key, warp-private counts, two block barriers a tile) it takes 72.9 ms;
        the same with two matches a key took 92.7; with every load issued before the ranking, at 2
        blocks a SM, 59.2 ms (2^24: 7.6 ms)."""
        if n >= 1 << 32:
            raise InputError(f"a window batch of {n} sort keys: positions must fit 32 bits")
        bits = min(32, max(1, bits))
        passes = -(-bits // RADIX_MAX_BITS)
        widths = [bits // passes + (1 if i < bits % passes else 0) for i in range(passes)]
        nblocks = max(1, -(-n // RADIX_TILE))
        counts = cupy.empty((1 << max(widths)) * nblocks, dtype=np.uint32)
        src_k, src_v, shift, perm = keys, None, 0, None
        for i, w in enumerate(widths):
            last = i == passes - 1
            cells = (1 << w) * nblocks
            self._k["msm_radix_hist"]((nblocks,), (RADIX_THREADS,),
                                      (src_k, _u64(n), _u32(shift), _u32(w), counts, _u32(nblocks)))
            offsets = cupy.cumsum(counts[:cells], dtype=np.uint32)
            offsets -= counts[:cells]
            dst_k = None if last else cupy.empty(n, dtype=np.uint32)
            dst_v = None if last else cupy.empty(n, dtype=np.uint32)
            perm = cupy.empty(n, dtype=np.int64) if last else None
            self._k["msm_radix_scatter"]((nblocks,), (RADIX_THREADS,), (
                src_k, _NULL if src_v is None else src_v, _u64(n), _u32(shift), _u32(w), offsets, _u32(nblocks),
                _NULL if last else dst_k, _NULL if last else dst_v, perm if last else _NULL))
            src_k, src_v, shift = dst_k, dst_v, shift + w
        return perm

    def _accumulate(self, perm: Any, keys: Any, idx: Any, n: int, m: int, cfg: int, n_buckets: int,
                    points: Any, stride: int, per: int, seg: int | None = None, marks: _Marks | None = None,
                    grid: bool = True) -> Any:
        """Buckets ``(n_buckets, xw)`` from n sorted entries (accumulate.cuh): key = keys[p],
        p = perm[j], bucket from the key (cfg), local window wl = p / m, scalar i = p - wl m, point
        row wl stride + idx[i] (or + i mod per: ``per`` scalars per MSM of a batch); ``seg``
        entries per thread (default ``params.seg``); ``marks``: where the grid rounds mark their phases;
        ``grid`` False: not the grid rounds (the ones' sum, one long run: measured slower there)."""
        buckets = cupy.zeros((n_buckets, self._xw), dtype=np.uint64)
        if grid and self.params.grid(self.G2):
            self._accumulate_grid(perm, keys, idx, n, m, cfg, n_buckets, points, stride, per, buckets, marks)
            return buckets
        if self.params.ba_rounds:
            heads, head_keys, t = self._accumulate_affine(perm, keys, idx, n, m, cfg, points, stride, per, buckets)
        else:
            seg = seg or self.params.seg
            t = -(-n // seg)
            heads = cupy.empty((t, self._xw), dtype=np.uint64)
            head_keys = cupy.empty(t, dtype=np.uint32)
            # msm_accumulate_split: two lanes a segment (t pairs)
            name, threads = ("msm_accumulate_split", 2 * t) if self._split else ("msm_accumulate", t)
            self._launch(name, threads, perm, keys, _NULL if idx is None else idx, points, buckets,
                         heads, head_keys, _u64(n), _u64(m), _u32(cfg), _u64(stride), _u32(seg), _u64(per))
        self._combine(heads, head_keys, t, buckets)
        return buckets

    def _combine(self, heads: Any, head_keys: Any, t: int, buckets: Any, continued: bool = False) -> None:
        """Combine levels (accumulate.cuh) until one segment covers the t heads: each adds the
        heads of a bucket into it. ``continued``: the first segment's first run may continue a
        bucket of an earlier list (a chunk of the grid rounds), so even one head is added."""
        seg2 = self.params.combine_seg
        while t > 1 or continued:
            continued = False
            t2 = -(-t // seg2)
            out = cupy.empty((t2, self._xw), dtype=np.uint64)
            out_keys = cupy.empty(t2, dtype=np.uint32)
            self._launch("msm_reduce", t2, _u32(OP_COMBINE), heads, head_keys, buckets, out, out_keys,
                         _u64(t), _u32(seg2), _u32(0))
            heads, head_keys, t = out, out_keys, t2

    def _accumulate_grid(self, perm: Any, keys: Any, idx: Any, n: int, m: int, cfg: int, n_buckets: int,
                         points: Any, stride: int, per: int, buckets: Any, marks: _Marks | None = None) -> None:
        """Level 1 by grid batch-affine rounds (grid_affine.cuh), ``params.ga_chunk`` sorted entries
        at a time: :func:`grid_rounds_for` rounds, each sharing one inversion among all its pairs,
        then the XYZZ level 1 and the combine levels over what is left, into ``buckets``. A chunk
        is a contiguous range of the sorted entries, so only its first bucket can continue the
        previous chunk's last one, and the head rule (accumulate.cuh) adds that part. The rounds'
        lengths stay on the device: every launch covers the chunk's upper bound. The denominator
        and sum passes run ``params.ga_threads`` threads, or (None) two waves of msm_ga_add's
        resident threads. ``marks`` (timed runs): the phases ga_rows, ga_scan, ga_den, ga_inv, ga_add."""
        p = self.params
        rounds = grid_rounds_for(n, n_buckets, p.ga_rounds)
        cw = self._aw // 2
        mark = marks.mark if marks is not None else (lambda name: None)
        threads = p.ga_threads or 2 * (self._ga_resident or GA_THREADS // 2)
        # One set of chunk buffers, made once and reused by every chunk (the launches are ordered on
        # the stream): allocating them per chunk would hold two chunks' lists at each reassignment,
        # twice what the device plan counts (plan.grid_list_bytes).
        c0 = min(p.ga_chunk, n)
        rows_all = cupy.empty(c0, dtype=np.uint64)
        bk_all = cupy.empty(c0 + 1, dtype=np.uint32)  # bk[0]: the bucket before the chunk
        slots0 = -(-c0 // 2)
        if rounds:
            counts_all = cupy.empty(slots0, dtype=np.uint32)
            pref_all = cupy.empty((slots0, cw), dtype=np.uint64)
            prods_all = cupy.empty((min(threads, slots0), cw), dtype=np.uint64)
            bufs_all = [(cupy.empty((c0, self._aw), dtype=np.uint64), cupy.empty(c0 + 1, dtype=np.uint32))
                        for _ in range(min(rounds, 2))]
        t0 = -(-c0 // p.seg)
        heads_all = cupy.empty((t0, self._xw), dtype=np.uint64)
        head_keys_all = cupy.empty(t0, dtype=np.uint32)
        for j0 in range(0, n, p.ga_chunk):
            c = min(p.ga_chunk, n - j0)
            rows, bk = rows_all[:c], bk_all[: c + 1]
            self._launch("msm_ga_rows", c, perm, keys, _NULL if idx is None else idx, _u64(j0), _u64(c), _u64(m),
                         _u32(cfg), _u64(stride), _u64(per), rows, bk[1:])
            mark("ga_rows")
            src: tuple[Any, ...] = (points, rows, _NULL, bk[1:], _NULL, _u64(c))
            slots = -(-c // 2)
            g = min(threads, slots)
            if rounds:
                counts, pref, prods = counts_all[:slots], pref_all[:slots], prods_all[:g]
                bufs = [(o[:c], ob[: c + 1]) for o, ob in bufs_all]
            for r in range(rounds):
                self._launch("msm_ga_count", slots, src[3], src[4], src[5], counts, _u64(slots))
                pos = cupy.cumsum(counts, dtype=np.int64)
                mark("ga_scan")
                self._launch("msm_ga_den", g, *src, pref, prods, _u64(g))
                mark("ga_den")
                self._invert_all(prods, g)
                mark("ga_inv")
                out, out_bk = bufs[r % 2]
                self._launch("msm_ga_add", g, *src, pos, pref, prods, out, out_bk[1:], _u64(g))
                mark("ga_add")
                src = (_NULL, _NULL, out, out_bk[1:], pos[slots - 1 :], _u64(0))
            t = -(-c // p.seg)
            heads, head_keys = heads_all[:t], head_keys_all[:t]
            self._launch("msm_accumulate_list", t, *src, buckets, heads, head_keys, _u32(p.seg), _u64(t))
            self._combine(heads, head_keys, t, buckets, continued=j0 > 0)

    def _invert_all(self, vals: Any, n: int) -> None:
        """The n field elements of ``vals`` (non-zero) -> their inverses, in place: tree levels
        of :data:`GA_INV_FAN` elements a thread, and one inversion at the top (msm_ga_inv)."""
        cw = self._aw // 2
        pre = cupy.empty((n, cw), dtype=np.uint64)
        g = -(-n // GA_INV_FAN)
        prods = cupy.empty((g, cw), dtype=np.uint64)
        if n <= GA_INV_FAN:
            self._launch("msm_ga_inv", 1, _u32(2), vals, pre, prods, _u64(n), _u64(1))
            return
        self._launch("msm_ga_inv", g, _u32(0), vals, pre, prods, _u64(n), _u64(g))
        self._invert_all(prods, g)
        self._launch("msm_ga_inv", g, _u32(1), vals, pre, prods, _u64(n), _u64(g))

    def _accumulate_affine(self, perm: Any, keys: Any, idx: Any, n: int, m: int, cfg: int, points: Any,
                           stride: int, per: int, buckets: Any) -> tuple[Any, Any, int]:
        """Level 1 by batch-affine rounds (batch_affine.cuh) into ``buckets``: (heads, head
        keys, segments). A persistent grid of the blocks resident at once, each thread with its
        scratch column: ``ba_cap(seg)`` points, ``ba_half(seg)`` suffix products, ``ba_cap(seg)``
        bucket ids (word-major, see the kernel)."""
        seg, block = self.params.ba_seg, self.params.nthreads
        nseg = -(-n // seg)
        nvb = -(-nseg // block)
        resident_blocks = self._ba_resident // block if self._ba_resident else 2
        grid = max(1, min(nvb, resident_blocks))
        g = grid * block
        cap = 2 * seg // 3 if seg >= 3 else 1
        half = seg // 2 if seg >= 2 else 1
        scratch = cupy.empty(g * (cap * self._aw + half * (self._aw // 2)) + -(-g * cap // 2), dtype=np.uint64)
        heads = cupy.empty((nseg, self._xw), dtype=np.uint64)
        head_keys = cupy.empty(nseg, dtype=np.uint32)
        self._k["msm_accumulate_affine"]((grid,), (block,), (
            perm, keys, _NULL if idx is None else idx, points, buckets, heads, head_keys, _u64(n), _u64(m),
            _u32(cfg | self.params.ba_rounds << 16), _u64(stride), _u32(seg), scratch, _u64(per)))
        return heads, head_keys, nseg

    def _window_sums(self, buckets: Any, nw: int, c: int) -> Any:
        """sum_k k B_k per window: chunk shares (reduce.cuh), then group sums."""
        nb = 1 << (c - 1)
        want = max(1, (nw * nb) // self.params.reduce_threads)
        chunk = min(max(1 << (want.bit_length() - 1), self.params.bucket_chunk_min), nb)
        per = nb // chunk
        shares = cupy.empty((nw * per, self._xw), dtype=np.uint64)
        self._launch("msm_reduce", nw * per, _u32(OP_BUCKETS), buckets, _NULL, _NULL, shares, _NULL,
                     _u64(nw * per), _u32(nb), _u32(chunk))
        return self._sum_blocks(shares, nw, per)


def _copy_device_async(src: Any, dst: Any, stream: Any) -> None:
    """Enqueue a device -> device copy of a whole C-contiguous array into another of its size."""
    cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, _D2D, stream.ptr)


def _copy_to_host_async(d: Any, host: np.ndarray, stream: Any) -> None:
    """Enqueue device -> page-locked host copy of a whole C-contiguous array on ``stream``."""
    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, d.data.ptr, host.nbytes, _D2H, stream.ptr)


def _pinned_like(a: np.ndarray) -> np.ndarray:
    """A zeroed page-locked host array of ``a``'s shape and dtype (the target of an async copy)."""
    mem = cupy.cuda.alloc_pinned_memory(max(1, a.nbytes))
    out = np.frombuffer(mem, dtype=a.dtype, count=a.size).reshape(a.shape)
    out[...] = 0
    return out


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
