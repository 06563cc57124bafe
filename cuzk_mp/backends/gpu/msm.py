"""Multi-scalar multiplication on the GPU over G1 and G2 (Pippenger, signed digits, 0/1 split).

Device state: an :class:`MsmG1` / :class:`MsmG2` holds a reference to its
resident point array (zkey layout, ``(n, 12)`` / ``(n, 24)`` uint64, Montgomery
coordinates, infinity = all zeros) and the compiled kernels of
``kernels/msm/msm.cu``; every other buffer lives only for one :meth:`run` (CuPy's
memory pool recycles them).

One run, for m standard-form scalars (``(m, 4)`` uint64, each < 2^255):

1. ``msm_classify`` tags each scalar 0, 1 or other (one 3-number sync).
2. Zeros are dropped. The points whose scalar is 1 are summed by the
   accumulation kernel as ONE bucket (keys all 0, identity order): one mixed
   addition per point, load-balanced in segments, instead of ~W in Pippenger
   (supraseal's batch-add split for boolean-heavy witnesses). Reusing the kernel
   keeps one inlined copy of the G2 mixed addition per module (each copy costs
   ~15 s of NVVM time).
3. The other scalars go through Pippenger with c-bit signed windows
   (W = ceil(256 / c)): ``msm_digits`` writes one sort key per (window,
   scalar), ``cupy.argsort`` (CUB radix sort) orders them by bucket,
   ``msm_accumulate`` adds each run of a bucket with segmented, load-balanced
   threads, ``msm_reduce`` combines runs that cross segments and reduces
   buckets to window sums (running sums per chunk). Windows are processed in
   batches so at most ``MsmParams.max_entries`` keys exist at once.
4. The W window sums and the ones' sum come back to the host, become arkworks
   points (:func:`point_from_xyzz`, Python ints) and are Horner-combined there
   (:func:`horner`: a c (W - 1) doubling chain that one GPU thread ran ~10x
   slower than arkworks does).

``last_timings`` holds CUDA-event ms per phase of the last run.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from ...algebra.curve import g1_to_ark, g2_to_ark
from ...algebra.field import Q_MOD, fq2_inv_int, fq2_mul_int, limbs_to_ints
from ...errors import ConfigError, InputError
from .modules import get_module, register

log = logging.getLogger("cuzk_mp.backends.gpu.msm")

MSM_PATH = "msm/msm.cu"
SCALAR_BITS = 256  # windows cover 256 bits: the Booth carry out of bit 254 still fits
OP_COMBINE, OP_BUCKETS, OP_GROUPS = 0, 1, 2  # msm_reduce ops (msm.cu)
_NULL = np.uint64(0)  # a null device pointer argument


@dataclass(frozen=True)
class MsmParams:
    """Knobs of one MSM object. Compiled in (one module per value, see :meth:`defines`):
    ``nthreads``, ``acc_min_blocks``, ``fp2_calls``, ``fp2_lazy``; the rest is launch geometry."""

    nthreads: int = 128  # threads per block of every kernel
    # msm_accumulate's __launch_bounds__ minimum blocks per SM (caps its registers at
    # 64 K / (nthreads x this)); None: 384 // nthreads for G1 (3 blocks of 128 at <= 168
    # registers: its occupancy before the by-value fix), 1 for G2 (255 registers, 2 blocks)
    acc_min_blocks: int | None = None
    fp2_calls: bool = False  # G2: Fq2 mul/sqr of the mixed addition as calls (EC_FP2_CALLS, ec/xyzz.cuh)
    fp2_lazy: bool = False  # G2: Fq2 mul with two reductions instead of three (EC_FP2_LAZY, ec/fp2_lazy.cuh)
    seg: int = 64  # sorted entries per accumulation thread
    combine_seg: int = 32  # heads per thread in each combine level
    group: int = 32  # inputs per thread in group sums
    reduce_threads: int = 1 << 16  # target thread count of the bucket reduction
    max_entries: int = 1 << 28  # sort keys alive at once (4 B key + 8 B index each)
    window_bits: int | None = None  # None: choose_window(number of tail scalars)

    def __post_init__(self) -> None:
        def pow2(x: int) -> bool:
            return x >= 1 and x & (x - 1) == 0

        if self.nthreads % 32 or not 32 <= self.nthreads <= 1024:
            raise ConfigError(f"MsmParams.nthreads={self.nthreads}: a multiple of 32 in [32, 1024]")
        if not pow2(self.group) or self.group < 2:
            raise ConfigError(f"MsmParams.group={self.group}: a power of two >= 2 (groups must not straddle windows)")
        if self.seg < 1 or self.combine_seg < 2 or self.reduce_threads < 1:
            raise ConfigError(f"MsmParams: seg >= 1, combine_seg >= 2, thread counts >= 1 (got {self})")
        if self.window_bits is not None and not 2 <= self.window_bits <= 24:
            raise ConfigError(f"MsmParams.window_bits={self.window_bits}: in [2, 24] (sort key packing)")
        if self.max_entries < 1:
            raise ConfigError(f"MsmParams.max_entries={self.max_entries}: >= 1")
        if self.acc_min_blocks is not None and not 1 <= self.acc_min_blocks <= 32:
            raise ConfigError(f"MsmParams.acc_min_blocks={self.acc_min_blocks}: in [1, 32] or None")

    def defines(self, g2: bool) -> dict[str, int]:
        """The ``-D`` knobs of the kernel module for one group."""
        min_blocks = self.acc_min_blocks or (1 if g2 else max(1, 384 // self.nthreads))
        out = {"MSM_G2": int(g2), "MSM_NTHREADS": self.nthreads, "MSM_ACC_MIN_BLOCKS": min_blocks}
        if g2:
            out["EC_FP2_CALLS"] = int(self.fp2_calls)
            out["EC_FP2_LAZY"] = int(self.fp2_lazy)
        return out


def choose_window(m: int) -> int:
    """Window bits for m scalars: floor(log2 m) - 4, clamped to [5, 21].

    21 caps the bucket memory (13 windows x 2^20 XYZZ buckets: 2.6 GB for G1).
    """
    return min(max(m.bit_length() - 1 - 4, 5), 21)


def window_count(c: int) -> int:
    """Signed c-bit windows needed for scalars below 2^255 (digits.cuh)."""
    return -(-SCALAR_BITS // c)


def ones_segment(n1: int, resident: int | None, seg: int) -> int:
    """Entries per thread for the sum of the n1 ones: the fewest whole waves of
    ``resident`` threads with at most ``seg`` entries each.

    With a fixed seg the last wave can be nearly empty (G2 at 2^24 PoRep-like:
    6.7 M ones / 64 = 105 k threads = 3.1 waves of 33.8 k, so ~22 % of the ones
    time idles); one segment per thread and wave costs nothing extra. ``resident``
    None (no occupancy query, e.g. the CPU emulator) keeps ``seg``.
    """
    if not resident:
        return seg
    waves = max(1, -(-n1 // (resident * seg)))
    return max(1, -(-n1 // (waves * resident)))


def _resident_threads(kernel: Any, nthreads: int) -> int | None:
    """Threads of ``kernel`` resident at once on the current device (occupancy x SMs);
    None where CuPy has no driver API (the CPU emulator's stand-in)."""
    driver = getattr(cupy.cuda, "driver", None)
    if driver is None:
        return None
    try:
        blocks = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.ptr, nthreads, 0))
        sms = int(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"])
    except Exception as exc:  # noqa: BLE001 - a tuning query: without it the ones' sum keeps `seg`
        log.warning("occupancy query failed (%s: %s); the ones' sum uses the fixed segment", type(exc).__name__, exc)
        return None
    return blocks * sms * nthreads


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


# ------------------------------------------------------------------ helpers


class _Marks:
    """CUDA events on the current stream; ms per named span (repeated names add up)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, Any]] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        ev = cupy.cuda.Event()
        ev.record()
        self.marks.append((name, ev))

    def spans(self) -> dict[str, float]:
        self.marks[-1][1].synchronize()
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + float(cupy.cuda.get_elapsed_time(a, b))
        out["total"] = float(cupy.cuda.get_elapsed_time(self.marks[0][1], self.marks[-1][1]))
        return out


def _as_rows(a: Any, width: int, what: str) -> Any:
    """A C-contiguous ``(n, width)`` uint64 device array (uploads a host array)."""
    d = cupy.ascontiguousarray(cupy.asarray(a))
    if d.dtype != np.uint64 or d.ndim != 2 or d.shape[1] != width:
        raise InputError(f"{what}: expected an (n, {width}) uint64 array, got {d.dtype} {tuple(d.shape)}")
    return d


def _u32(x: int) -> np.uint32:
    return np.uint32(x)


def _u64(x: int) -> np.uint64:
    return np.uint64(x)


# ------------------------------------------------------------------ the MSM objects


class _Msm:
    """Pippenger MSM over resident points; subclasses fix the group."""

    G2 = False

    def __init__(self, d_points: Any, params: MsmParams | None = None) -> None:
        self.params = params or MsmParams()
        self._aw = 24 if self.G2 else 12  # uint64 words per affine point
        self._xw = 2 * self._aw  # per XYZZ point
        self.d_points = _as_rows(d_points, self._aw, f"{type(self).__name__} points")
        self.n = int(self.d_points.shape[0])
        mod = get_module(MSM_PATH, self.params.defines(self.G2))
        self._k = {name: mod.get_function(name) for name in
                   ("msm_classify", "msm_digits", "msm_accumulate", "msm_reduce")}
        self._resident = _resident_threads(self._k["msm_accumulate"], self.params.nthreads)
        self.last_timings: dict[str, float] = {}

    @property
    def resident_threads(self) -> int | None:
        """msm_accumulate threads resident at once on this device (None: not known)."""
        return self._resident

    @property
    def nbytes(self) -> int:
        """Device bytes held between runs (the resident points; no precomputation)."""
        return 0 if self.d_points is None else int(self.d_points.nbytes)

    def close(self) -> None:
        """Drop the reference to the points (idempotent)."""
        self.d_points = None

    def run(self, d_scalars: Any, *, stream: Any = None) -> G1Point | G2Point:
        """sum_i scalars[i] * points[i] for the first m = len(scalars) points.

        ``d_scalars``: ``(m, 4)`` uint64 standard form (device or host), m <= n.
        Runs on ``stream`` (default: the current stream); returns when done.
        """
        if self.d_points is None:
            raise InputError(f"{type(self).__name__}.run after close()")
        scalars = _as_rows(d_scalars, 4, f"{type(self).__name__} scalars")
        if scalars.shape[0] > self.n:
            raise InputError(f"{type(self).__name__}: {scalars.shape[0]} scalars for {self.n} points")
        with stream if stream is not None else contextlib.nullcontext():
            return self._run(scalars)

    def _launch(self, name: str, threads: int, *args: Any) -> None:
        block = self.params.nthreads
        self._k[name]((max(1, -(-threads // block)),), (block,), args)

    def _run(self, scalars: Any) -> G1Point | G2Point:
        m = int(scalars.shape[0])
        marks = _Marks()
        cls = cupy.empty(m, dtype=np.uint8)
        flag = cupy.zeros(1, dtype=np.uint32)
        if m:
            self._launch("msm_classify", m, scalars, cls, flag, _u64(m))
        n1, n2, bad = (int(v) for v in cupy.asnumpy(cupy.stack(
            [cupy.count_nonzero(cls == 1), cupy.count_nonzero(cls == 2), flag[0].astype(np.int64)])))
        if bad:
            raise InputError(f"{type(self).__name__} scalars: a row has bit 255 set "
                             "(expected canonical standard-form Fr elements)")
        marks.mark("classify")
        ones = self._sum_ones(cls, n1) if n1 else None
        marks.mark("ones")
        wsums, nw, c = self._pippenger(scalars, cls, n2, marks) if n2 else (None, 0, 0)
        parts = [a for a in (wsums, ones) if a is not None]
        words = cupy.asnumpy(cupy.concatenate(parts)) if parts else np.zeros((0, self._xw), dtype=np.uint64)
        result = horner(words[:nw], c, words[nw:], self.G2)
        marks.mark("finish")
        self.last_timings = marks.spans()
        return result

    # ---- 0/1 split
    def _sum_ones(self, cls: Any, n1: int) -> Any:
        """Sum of the points whose scalar is 1: one bucket of the accumulation kernel, in
        segments sized by :func:`ones_segment` (whole waves of resident threads)."""
        idx = cupy.flatnonzero(cls == 1)
        keys = cupy.zeros(n1, dtype=np.uint32)  # window 0, bucket 0, positive
        seg = ones_segment(n1, self._resident, self.params.seg)
        return self._accumulate(cupy.arange(n1, dtype=np.int64), keys, idx, n1, n1, 1, 1, seg)

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
    def _pippenger(self, scalars: Any, cls: Any, n2: int, marks: _Marks) -> tuple[Any, int, int]:
        m = int(scalars.shape[0])
        idx = None if n2 == m else cupy.flatnonzero(cls == 2)
        c = self.params.window_bits or choose_window(n2)
        nw_total = window_count(c)
        per_batch = max(1, min(nw_total, self.params.max_entries // n2))
        wsums = cupy.empty((nw_total, self._xw), dtype=np.uint64)
        for w0 in range(0, nw_total, per_batch):
            nw = min(per_batch, nw_total - w0)
            keys = cupy.empty(nw * n2, dtype=np.uint32)
            self._launch("msm_digits", n2, scalars, _NULL if idx is None else idx, keys, _u64(n2),
                         _u32(w0), _u32(nw), _u32(c))
            marks.mark("digits")
            perm = cupy.argsort(keys)
            marks.mark("sort")
            buckets = self._accumulate(perm, keys, idx, nw * n2, n2, c, nw << (c - 1))
            marks.mark("accumulate")
            wsums[w0 : w0 + nw] = self._window_sums(buckets, nw, c)
            marks.mark("reduce")
        return wsums, nw_total, c

    def _accumulate(self, perm: Any, keys: Any, idx: Any, n: int, m: int, c: int, n_buckets: int,
                    seg: int | None = None) -> Any:
        """Buckets ``(n_buckets, xw)`` from n sorted entries (accumulate.cuh): key = keys[perm[j]],
        bucket key >> 1, scalar perm[j] - (key >> c) m, point row idx[scalar] (or the scalar);
        ``seg`` entries per thread (default ``params.seg``)."""
        seg = seg or self.params.seg
        buckets = cupy.zeros((n_buckets, self._xw), dtype=np.uint64)
        t = -(-n // seg)
        heads = cupy.empty((t, self._xw), dtype=np.uint64)
        head_keys = cupy.empty(t, dtype=np.uint32)
        self._launch("msm_accumulate", t, perm, keys, _NULL if idx is None else idx, self.d_points, buckets,
                     heads, head_keys, _u64(n), _u64(m), _u32(c), _u32(seg))
        seg2 = self.params.combine_seg
        while t > 1:
            t2 = -(-t // seg2)
            out = cupy.empty((t2, self._xw), dtype=np.uint64)
            out_keys = cupy.empty(t2, dtype=np.uint32)
            self._launch("msm_reduce", t2, _u32(OP_COMBINE), heads, head_keys, buckets, out, out_keys,
                         _u64(t), _u32(seg2), _u32(0))
            heads, head_keys, t = out, out_keys, t2
        return buckets

    def _window_sums(self, buckets: Any, nw: int, c: int) -> Any:
        """sum_k k B_k per window: chunk shares (reduce.cuh), then group sums."""
        nb = 1 << (c - 1)
        want = max(1, (nw * nb) // self.params.reduce_threads)
        chunk = min(max(1 << (want.bit_length() - 1), 16), nb)
        per = nb // chunk
        shares = cupy.empty((nw * per, self._xw), dtype=np.uint64)
        self._launch("msm_reduce", nw * per, _u32(OP_BUCKETS), buckets, _NULL, _NULL, shares, _NULL,
                     _u64(nw * per), _u32(nb), _u32(chunk))
        return self._sum_blocks(shares, nw, per)


class MsmG1(_Msm):
    """G1 MSM over resident ``(n, 12)`` zkey-layout points."""

    G2 = False

    def run(self, d_scalars: Any, *, stream: Any = None) -> G1Point:  # noqa: D102 - see _Msm.run
        result = super().run(d_scalars, stream=stream)
        assert isinstance(result, G1Point)
        return result


class MsmG2(_Msm):
    """G2 MSM over resident ``(n, 24)`` zkey-layout points."""

    G2 = True

    def run(self, d_scalars: Any, *, stream: Any = None) -> G2Point:  # noqa: D102 - see _Msm.run
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


register(MSM_PATH, MsmParams().defines(False))
register(MSM_PATH, MsmParams().defines(True))
