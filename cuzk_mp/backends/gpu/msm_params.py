"""The knobs of one MSM object (:class:`MsmParams`), and the parameters each key size runs with.

Why a module of its own: :class:`MsmParams` is where every measured choice of the MSM's kernels
is written down (compiled-in defines and launch geometry, each with its measurement), and the
MSM objects, the device plan, the shipped variants and the benches all build one. Its defaults for
the accumulation and the sort come from the environment (:mod:`.env_knobs`) when
one is made. No CuPy here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import ConfigError
from .env_knobs import (
    GA_CHUNK,
    SORT_MODES,
    grid_for_g1,
    grid_rounds,
    grid_where_fits,
    msm_graphs_enabled,
    sort_default,
)
from .msm_geometry import window_count


@dataclass(frozen=True)
class MsmParams:
    """Knobs of one MSM object. Compiled in (one module per value, see :meth:`defines`):
    ``nthreads``, ``acc_min_blocks``; the rest is launch geometry (an MSM object's ``params``
    may be replaced by one with other launch knobs between runs)."""

    nthreads: int = 128  # threads per block of every kernel
    # msm_accumulate's __launch_bounds__ minimum blocks per SM (caps its registers at
    # 64 K / (nthreads x this)); None: 512 // nthreads for G1 (4 blocks of 128 at <= 128
    # registers: ptxas spills no more there than at 3 blocks' 168, and the kernel's IMAD chains
    # want the warps), 1 for G2 (255 registers, 2 blocks)
    acc_min_blocks: int | None = None
    seg: int = 64  # sorted entries per accumulation thread
    # heads per thread in each combine level, inputs per thread in each group-sum level: pairwise.
    # A level's threads each add a chain of this many points, and the last levels run a few
    # threads, so their chains are latency; pairwise levels do the same additions in all in the
    # shortest chains. Measured on the H200 (perf/results/gpu-msm-reduce-h200.json, random, every
    # result checked) against 32 / 32 and 2^16 reduction threads: G1 2^24 with multiples 92.9 ms
    # against 96.7, G2 293.8 against 302.5, G1 2^24 plain 106.0 against 107.5, 2^27 755.3 against 772.6.
    combine_seg: int = 2
    group: int = 2
    # target thread count of the bucket reduction: nb / this buckets a thread. Where each thread's
    # share ended with a scalar multiplication by its first bucket's index (reduce_levels 1), fewer,
    # longer chunks paid while the threads still filled the device (2^15 beat 2^16 and 2^17 in the
    # runs above)
    reduce_threads: int = 1 << 15
    # how a chunk's plain sum S_j gets its weight j chunk (kernels/msm/reduce.cuh): 2 = a second,
    # small reduction over the chunks' sums (2 additions a chunk, ~6 more launches and a longer
    # chain of dependent additions), 1 = a scalar multiplication in every thread (~log2(buckets)
    # doublings: a quarter of a 64-bucket chunk's work), 0 = 2 where the reduction's threads fill
    # the device (at least reduce_threads / 2: throughput-bound), else 1 (small MSMs, latency-bound).
    # The default stays 1, the way every device figure above was measured, until a device A/B
    # (perf/gpu_msm_notes.md, "The bucket reduction without a scalar multiplication a thread")
    # shows 0 or 2 no slower; both are checked against arkworks on the emulator.
    reduce_levels: int = 1
    # fewest buckets per thread of the bucket reduction (a power of two): a thread's chain is 2 chunk
    # additions plus a ~c-bit scalar multiplication, so small MSMs, whose few threads leave the GPU
    # latency-bound, want short chunks (and small groups, combine_seg); large ones are throughput-bound
    bucket_chunk_min: int = 16
    max_entries: int = 1 << 28  # sort keys alive at once (4 B key + 8 B index each)
    window_bits: int | None = None  # None: choose_window(number of tail scalars); ignored with precomputed multiples
    # Grid batch-affine accumulation (kernels/msm/grid_affine.cuh): at most this many rounds of
    # affine additions sharing one inversion over all their pairs; 0 = off.
    ga_rounds: int = field(default_factory=grid_rounds)
    ga_g1: bool = field(default_factory=grid_for_g1)  # the grid rounds for G1 too (else G2 alone)
    # the grid rounds only where the plan fits their lists as configured ("auto": plan.plan_device)
    ga_where_fits: bool = field(default_factory=grid_where_fits)
    ga_chunk: int = GA_CHUNK  # sorted entries per pass of the rounds
    ga_threads: int | None = None  # threads of the denominator and sum passes (None: from the occupancy)
    # msm_ga_add's __launch_bounds__ minimum blocks per SM (compiled in; None: ptxas chooses)
    ga_min_blocks: int | None = None
    # Dense passes small enough run as captured CUDA graphs (msm.py, GRAPH_MAX_ENTRIES): one launch
    # instead of ~20, for MSMs whose kernels are shorter than their launches.
    graphs: bool = False
    # G1 modules: every formula's Y3 = a b - c d as one CIOS pass with one reduction (ff/mont.cuh
    # mul_add, ec/xyzz.cuh EC_FQ_FUSED=1): 444 instead of 600 products.
    # Measured on the H200 at 2^24 random: accumulation 103.2 ms against 108.9, the MSM 128.6
    # against 135.0 (perf/gpu_msm_notes.md), so it is the default. (The same fusion for G2, as an
    # Fq2 call with two reductions instead of four, was measured 35 % slower and is not kept.)
    fq_fused: bool = True
    # G1 modules: the formulas' Fq products, squares and fused a b - c d as __noinline__ calls with
    # operands by value (ec/xyzz.cuh EC_FQ_CALLS=1): one bucket step runs
    # through ~42 KB of code instead of ~73 KB, for ~6 % more instructions (the call moves) and
    # ~130 L1-resident local accesses per step (call saves). Measured on the H200 at 2^24 random:
    # the MSM 107.2 ms against 128.4 inlined (accumulation 88.2 / 103.0, reduction 9.2 / 15.6;
    # "no instruction" stalls 31 % -> 6 % of the accumulation's samples), PoRep-like 33.3 / 39.8;
    # with 3, 5 or 6 blocks per SM 89.4 / 91.1 / 95.4 ms of accumulation (perf/gpu_msm_notes.md).
    fq_calls: bool = True
    # msm_radix_scatter's __launch_bounds__ minimum blocks of 256 per SM (compiled in, both groups; None:
    # the kernel's default, MSM_RADIX_MIN_BLOCKS in msm.cu)
    radix_min_blocks: int | None = None
    # how window batches the counting sort does not take are sorted: "radix" or "argsort" (SORT_ENV)
    large_sort: str = field(default_factory=sort_default)

    def __post_init__(self) -> None:
        def pow2(x: int) -> bool:
            return x >= 1 and x & (x - 1) == 0

        if self.nthreads % 32 or not 32 <= self.nthreads <= 1024:
            raise ConfigError(f"MsmParams.nthreads={self.nthreads}: a multiple of 32 in [32, 1024]")
        if not pow2(self.group) or self.group < 2:
            raise ConfigError(f"MsmParams.group={self.group}: a power of two >= 2 (groups must not straddle windows)")
        if not pow2(self.bucket_chunk_min):
            raise ConfigError(f"MsmParams.bucket_chunk_min={self.bucket_chunk_min}: a power of two >= 1")
        if self.reduce_levels not in (0, 1, 2):
            raise ConfigError(f"MsmParams.reduce_levels={self.reduce_levels}: 0 (by size), 1 or 2")
        if self.seg < 1 or self.combine_seg < 2 or self.reduce_threads < 1:
            raise ConfigError(f"MsmParams: seg >= 1, combine_seg >= 2, thread counts >= 1 (got {self})")
        if self.window_bits is not None and not 2 <= self.window_bits <= 24:
            raise ConfigError(f"MsmParams.window_bits={self.window_bits}: in [2, 24] (sort key packing)")
        if self.max_entries < 1:
            raise ConfigError(f"MsmParams.max_entries={self.max_entries}: >= 1")
        if self.acc_min_blocks is not None and not 1 <= self.acc_min_blocks <= 32:
            raise ConfigError(f"MsmParams.acc_min_blocks={self.acc_min_blocks}: in [1, 32] or None")
        if self.large_sort not in SORT_MODES:
            raise ConfigError(f"MsmParams.large_sort={self.large_sort!r}: one of {', '.join(SORT_MODES)}")
        if self.radix_min_blocks is not None and not 1 <= self.radix_min_blocks <= 8:
            raise ConfigError(f"MsmParams.radix_min_blocks={self.radix_min_blocks}: in [1, 8] or None")
        if self.ga_min_blocks is not None and not 1 <= self.ga_min_blocks <= 16:
            raise ConfigError(f"MsmParams.ga_min_blocks={self.ga_min_blocks}: in [1, 16] or None")
        if not 0 <= self.ga_rounds <= 64 or self.ga_chunk < 2 or (self.ga_threads is not None and self.ga_threads < 1):
            raise ConfigError(f"MsmParams: ga_rounds in [0, 64], ga_chunk >= 2, ga_threads >= 1 (got {self.ga_rounds}, "
                              f"{self.ga_chunk}, {self.ga_threads})")

    def second_reduction(self, threads: int) -> bool:
        """Whether a bucket reduction of ``threads`` chunk threads weights the chunks' sums by a
        second reduction (``reduce_levels``)."""
        return self.reduce_levels == 2 or (self.reduce_levels == 0 and 2 * threads >= self.reduce_threads)

    def grid(self, g2: bool) -> bool:
        """Whether this group's MSMs take the grid batch-affine rounds."""
        return self.ga_rounds > 0 and (g2 or self.ga_g1)

    def defines(self, g2: bool) -> dict[str, int]:
        """The ``-D`` knobs of the kernel module for one group."""
        min_blocks = self.acc_min_blocks or (1 if g2 else max(1, 512 // self.nthreads))
        out = {"MSM_G2": int(g2), "MSM_NTHREADS": self.nthreads, "MSM_ACC_MIN_BLOCKS": min_blocks}
        if g2:
            out.update(G2_FP2)
        if self.ga_min_blocks:
            out["GA_ADD_MIN_BLOCKS"] = self.ga_min_blocks
        if self.radix_min_blocks:
            out["MSM_RADIX_MIN_BLOCKS"] = self.radix_min_blocks
        if self.fq_fused and not g2:
            out["EC_FQ_FUSED"] = 1
        if self.fq_calls and not g2:
            out["EC_FQ_CALLS"] = 1
        return out


def reduce_chunks(nw: int, nb: int, params: MsmParams) -> tuple[int, int]:
    """The bucket reduction's cut of ``nw`` windows of ``nb`` buckets (powers of two): buckets a
    thread and threads a window, about ``params.reduce_threads`` threads in all, at least
    ``params.bucket_chunk_min`` buckets a thread."""
    want = max(1, (nw * nb) // params.reduce_threads)
    chunk = min(max(1 << (want.bit_length() - 1), params.bucket_chunk_min), nb)
    return chunk, nb // chunk


# How the G2 MSM module compiles its Fq2 products (ec/xyzz.cuh): as __noinline__ calls (a third
# of the code per bucket step) with the lazy-reduction product (ff/fp2_lazy.cuh, two Montgomery
# reductions instead of three). Measured on the H200 at 2^24 random: 334 ms, against 440 inline,
# 372 calls alone, 493 lazy alone (perf/gpu_msm_notes.md).
G2_FP2 = {"EC_FP2_CALLS": 1, "EC_FP2_LAZY": 1}

# A dense MSM pass (msm.py) is captured into a CUDA graph when it batches at most GRAPH_MAX_BATCH
# vectors (the prover's batch cap) and its sort keys number at most GRAPH_MAX_ENTRIES (a 2^12 proof
# has ~90 K per MSM, a 2^16 one ~1 M); each MSM object keeps at most GRAPH_RUNS graphs in all (any
# batch sizes; past that a pass runs without one), each with its own buffers for the object's life:
# ~200 MB for G2 at the entry limit (plan.graph_bytes counts them).
GRAPH_MAX_BATCH = 8
GRAPH_MAX_ENTRIES = 1 << 21
GRAPH_RUNS = 3


# Launch geometry of the MSMs of small keys (no compiled-in knob changes: the shipped modules
# serve). A small MSM runs far fewer accumulation threads than the device holds at once, so its
# time is the length of each thread's chain of dependent additions: ``seg`` sorted entries per
# accumulation thread, then ``combine_seg`` heads per thread in each combine level, then the bucket
# reduction (``bucket_chunk_min`` buckets per thread and a scalar multiple of their sum) and the
# group sums (``group`` per thread and level). Shorter chains cost a few more additions in all and
# cut the latency: on the H200 at 2^16, 4/4 lowered a lone proof from 13.6 to 11.3 ms against 16/16
# (perf/results/gpu-small-h200.json), and a 2^16 proof's kernel time was 85% bucket reduction and
# group sums at chunk 16 and groups of 32 (its timeline), hence short chunks and groups. Once the
# dense passes ran as CUDA graphs (launches nearly free), pairwise combine levels and group sums won
# at 2^12 (a lone proof 3.22 ms with 4 entries per thread, 3.07 with 2, against 3.23 and 3.45 with
# 4-way levels), while 2^16 and 2^18 kept 8 entries per accumulation thread and 4-way levels (2^16:
# 6.83 against 8.51-11.04 ms; 2^18: 12.41 against 13.16-20.79 ms): perf/results/gpu-small-h200.json,
# the ``params`` rows.
# (Knobs, not MsmParams: an MsmParams reads CUZK_GPU_MSM_ACCUMULATE when it is made.) No grid
# rounds: these MSMs are latency-bound, and each round adds four launches and an inversion tree.
SMALL_MSM_PARAMS: tuple[tuple[int, dict[str, Any]], ...] = (
    (1 << 14, {"seg": 4, "combine_seg": 2, "group": 2, "bucket_chunk_min": 2, "graphs": True, "ga_rounds": 0}),
    (1 << 16, {"seg": 8, "combine_seg": 4, "group": 4, "bucket_chunk_min": 4, "graphs": True, "ga_rounds": 0}),
    (1 << 18, {"seg": 8, "combine_seg": 4, "group": 4, "bucket_chunk_min": 4, "ga_rounds": 0}),
)


def msm_params_for(n_points: int) -> MsmParams:
    """The MSM parameters of a key section of ``n_points`` points (:data:`SMALL_MSM_PARAMS`, else
    the defaults); CUDA graphs only while env CUZK_GPU_MSM_GRAPHS leaves them on."""
    for limit, knobs in SMALL_MSM_PARAMS:
        if n_points <= limit:
            params = MsmParams(**knobs)
            return replace(params, graphs=params.graphs and msm_graphs_enabled())
    return MsmParams()


def graph_batch_limit(m: int, c: int) -> int:
    """The most vectors of m scalars (c-bit windows) a dense pass may batch and still be captured
    into a CUDA graph: GRAPH_MAX_BATCH, fewer where k m W sort keys would pass GRAPH_MAX_ENTRIES
    (0: not even one vector)."""
    return min(GRAPH_MAX_BATCH, GRAPH_MAX_ENTRIES // (max(1, m) * window_count(c)))


def graph_params_for(domain_size: int) -> MsmParams | None:
    """The MSM geometry of a key of ``domain_size`` rows when its MSMs run as CUDA graphs (what its
    device plan counts the graphs' buffers with: :func:`.plan.plan_device`), else None."""
    params = msm_params_for(domain_size)
    return params if params.graphs else None
