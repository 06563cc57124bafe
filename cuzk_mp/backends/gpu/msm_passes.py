"""The device passes of a Pippenger MSM: sort, bucket accumulation, combine and window sums.

Why a module of its own: these are the kernels' launch sequences once the sort keys exist, the
largest and most measured part of an MSM (the counting and radix sorts, the XYZZ and grid
batch-affine accumulations, the combine levels, the bucket reduction). :class:`_MsmPasses`
is the base of :class:`.msm._Msm`, which owns the points, the kernels and the runs; nothing here
allocates anything that outlives a run.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from ...errors import InputError
from .env_knobs import GA_INV_FAN, GA_THREADS
from .msm_geometry import grid_rounds_for
from .msm_host import _NULL, _Marks, _u32, _u64
from .msm_params import GRAPH_MAX_ENTRIES, MsmParams, reduce_chunks

OP_COMBINE, OP_BUCKETS, OP_GROUPS, OP_ADD = 0, 1, 2, 3  # msm_reduce ops (msm.cu)

# A window batch with at most this many buckets is ordered by the counting sort (sort.cuh): its
# one-block scan walks the counters in ranges of bins / SCAN_THREADS, so far larger bucket sets
# (2^24-point MSMs without multiples) keep the radix sort.
COUNTING_SORT_BINS = 1 << 20
# ... and only where it has few keys (those a captured graph holds: its three launches are what a
# small MSM's latency wants) or few buckets. Its one-block scan takes ~1 ns a bucket whatever the
# keys: in a 2^24 PoRep-like partition on an H100 the counting sort of 53.7 M keys over ~2^20
# buckets took 4.1 ms (count 1.18, scan 1.13, scatter 1.83) where the radix sort of 40.3 M keys took
# 2.0 ms in three passes (perf/results/partition-census-h100-2026-12-07.json; the whole partition with
# this rule against the one before is still to time on a device: perf/gpu_session.py --sections partition
# --partition-counting-keys shipped,62). A batch a graph captures has at most
# GRAPH_MAX_ENTRIES keys, so every captured pass sorts as it did before this rule.
COUNTING_SORT_KEYS = GRAPH_MAX_ENTRIES
COUNTING_SORT_SCAN_BINS = 1 << 16


def counting_sort_takes(n: int, bins: int) -> bool:
    """Whether a window batch of ``n`` sort keys over ``bins`` buckets is ordered by the counting
    sort (else the radix sort)."""
    return bins <= COUNTING_SORT_BINS and (n <= COUNTING_SORT_KEYS or bins <= COUNTING_SORT_SCAN_BINS)


# The radix sort's launch geometry (MSM_RADIX_THREADS x MSM_RADIX_ITEMS keys a tile, digits of at
# most MSM_RADIX_MAX_BITS bits: kernels/msm/sort.cuh).
RADIX_THREADS = 256
RADIX_TILE = RADIX_THREADS * 16
RADIX_MAX_BITS = 9
SCAN_THREADS = 512  # msm_sort_scan's largest block (MSM_SCAN_THREADS in msm.cu)


def scan_threads(bins: int) -> int:
    """msm_sort_scan's block for ``bins`` counters: ~16 counters per thread, a multiple of 32 from
    32 to SCAN_THREADS (a few thousand buckets need no 512 threads; nor does the emulator, whose
    block runs as fibers)."""
    return min(SCAN_THREADS, max(32, -(-bins // (16 * 32)) * 32))


class _MsmPasses:
    """The sort and accumulation passes of an MSM object over its kernels (``_k``, loaded by
    :class:`.msm._Msm`, which sets every attribute below)."""

    G2: bool
    params: MsmParams
    _k: dict[str, Any]
    _aw: int  # uint64 words per affine point
    _xw: int  # per XYZZ point
    _ga_resident: int | None

    def _launch(self, name: str, threads: int, *args: Any) -> None:
        block = self.params.nthreads
        self._k[name]((max(1, -(-threads // block)),), (block,), args)

    def _sum_blocks(self, arr: Any, blocks: int, per: int, out: Any = None) -> Any:
        """Sum each run of ``per`` consecutive XYZZ points: ``(blocks, xw)``, the last level written
        into ``out`` where given (per > 1).

        With blocks > 1, ``per`` and ``params.group`` are powers of two, so no
        group straddles two blocks.
        """
        while per > 1:
            g = min(self.params.group, per)
            new_per = -(-per // g)
            dst = out if new_per == 1 and out is not None else cupy.empty((blocks * new_per, self._xw),
                                                                          dtype=np.uint64)
            self._launch("msm_reduce", blocks * new_per, _u32(OP_GROUPS), arr, _NULL, _NULL, dst, _NULL,
                         _u64(blocks * per), _u32(g), _u32(0))
            arr, per = dst, new_per
        return arr

    def _sort(self, keys: Any, n: int, bins: int, cfg: int) -> Any:
        """Positions of the n keys (``keys`` holds n + 1: the last is scratch) ordered by bucket
        (``bins`` buckets; zero digits last): the counting sort (sort.cuh) where
        :func:`counting_sort_takes` the batch, else the radix sort over the bits the keys use (or
        ``cupy.argsort``, ``params.large_sort``)."""
        if not counting_sort_takes(n, bins):
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
        seg = seg or self.params.seg
        t = -(-n // seg)
        heads = cupy.empty((t, self._xw), dtype=np.uint64)
        head_keys = cupy.empty(t, dtype=np.uint32)
        self._launch("msm_accumulate", t, perm, keys, _NULL if idx is None else idx, points, buckets,
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

    def _window_sums(self, buckets: Any, nw: int, c: int, out: Any = None) -> Any:
        """sum_k k B_k per window: chunk shares (reduce.cuh), then group sums; ``(nw, xw)``, written
        into ``out`` (C-contiguous, that shape) where given, so that no copy follows."""
        return self._weighted_sums(buckets, nw, 1 << (c - 1), out, True)

    def _weighted_sums(self, buckets: Any, nw: int, nb: int, out: Any, may_nest: bool) -> Any:
        """sum_k k B_k per window of ``nb`` buckets. Each chunk's share needs its plain sum S_j times
        j chunk: where ``may_nest`` and ``params.second_reduction``, those are summed by a second,
        small reduction over the S_j (this method again, over nb / chunk "buckets", not nesting
        further: sum_j j S_j, times chunk by doublings, added to each window once), else by a
        scalar multiplication in every thread."""
        chunk, per = reduce_chunks(nw, nb, self.params)
        shares = out if per == 1 and out is not None else cupy.empty((nw * per, self._xw), dtype=np.uint64)
        two = may_nest and per > 1 and self.params.second_reduction(nw * per)
        sums = cupy.empty((nw * per, self._xw), dtype=np.uint64) if two else None
        self._launch("msm_reduce", nw * per, _u32(OP_BUCKETS), buckets, _NULL, sums if sums is not None else _NULL,
                     shares, _NULL, _u64(nw * per), _u32(nb), _u32(chunk))
        total = self._sum_blocks(shares, nw, per, out)
        if sums is not None:  # total += chunk * sum_j j S_j, window by window
            weighted = self._weighted_sums(sums, nw, per, None, False)
            self._launch("msm_reduce", nw, _u32(OP_ADD), weighted, _NULL, _NULL, total, _NULL,
                         _u64(nw), _u32(chunk.bit_length() - 1), _u32(0))
        return total
