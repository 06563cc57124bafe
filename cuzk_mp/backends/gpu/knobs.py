"""Knobs of the kernel modules: compile-time defines, launch geometry and the module variants
the package ships compiled.

Each kernel module is one translation unit (:mod:`.source`) compiled with ``-D``
knobs; a (module, knobs) pair is a *variant*. :data:`SHIPPED` lists the variants
built ahead of time by ``scripts/build_kernels.py`` into ``kernels/bin`` (a fatbin
per variant with machine code for the listed architectures), which
:mod:`.modules` loads instead of compiling. No CuPy here: the build script and
the CI check of the shipped binaries import this on machines without a GPU.

The geometry choices that need no device live here too: MSM window sizes, and which key
sections get precomputed multiples (:func:`plan_multiples`).

Groups: ``prover`` (what a prover process loads before it reports READY) and
``setup`` (the dev setup's fixed-base kernels, also used for the MSM's
precomputed multiples).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import ConfigError

# Every GPU generation the prover supports, as SASS targets.
ALL_ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100")

MSM_PATH = "msm/msm.cu"
FB_PATH = "fixed_base/fixed_base.cu"
NTT_PATH = "ntt/ntt.cu"
H_PATH = "h/h.cu"
WITNESS_MAP_PATH = "witness/witness_map.cu"


@dataclass(frozen=True)
class NttParams:
    """Compile-time knobs of kernels/ntt/ntt.cu (each becomes a -D define), and the chunk policy."""

    tile_lg: int = 10  # shared-memory tile: 2^tile_lg Fr elements (32 KiB at 10)
    # Contiguous rows per access in the non-low passes: 4 x 32 B = one 128-byte line. 2 rather
    # than 3 leaves 8 bits per pass, so 2^25..2^26 need 3 passes instead of 4 (measured on the
    # H200, 2026-11-30: chunk 2 and 3 equal at 2^24, where both take 3 passes). Sizes where
    # chunk - 1 saves a pass use it (see plan_params).
    chunk_lg: int = 2
    threads: int = 256
    adapt_chunk: bool = True  # let plan_params lower chunk_lg where that saves a pass

    def defines(self) -> dict[str, int]:
        """The -D knobs that differ from the kernel's own #ifndef defaults (which equal this
        class's defaults), so the default variant is the one shipped without defines."""
        knobs = {"NTT_TILE_LG": self.tile_lg, "NTT_CHUNK_LG": self.chunk_lg, "NTT_THREADS": self.threads}
        return {k: v for k, v in knobs.items() if v != NTT_KERNEL_DEFAULTS[k]}


# The #ifndef defaults of kernels/ntt/ntt.cu (tests/test_gpu_ntt.py checks they match).
NTT_KERNEL_DEFAULTS = {"NTT_TILE_LG": 10, "NTT_CHUNK_LG": 2, "NTT_THREADS": 256}


def pass_schedule(lg: int, params: NttParams = NttParams()) -> list[tuple[int, int]]:
    """(s_lo, k) of each pass in ascending bit order (the DIT order; DIF runs it reversed)."""
    k0 = min(lg, params.tile_lg)
    passes = [(0, k0)]
    rest, kmax = lg - k0, params.tile_lg - params.chunk_lg
    npass = -(-rest // kmax)
    s = k0
    for i in range(npass):
        k = rest // npass + (1 if i < rest % npass else 0)
        passes.append((s, k))
        s += k
    return passes


def plan_params(lg: int, params: NttParams) -> NttParams:
    """The knobs a 2^lg transform runs with: ``chunk_lg - 1`` when that needs fewer passes.

    Measured on the H200 (perf/results/gpu-h200.json, 2026-11-30): 2^27 forward NTT 55.5 ms
    with chunk 2 (4 passes) and 48.6 ms with chunk 1 (3 passes); at 2^24 and 2^26, where both
    take 3 passes, chunk 1 is 3-6 % slower, so the default chunk stays elsewhere.
    """
    if params.chunk_lg < 2 or not params.adapt_chunk:
        return params
    smaller = replace(params, chunk_lg=params.chunk_lg - 1)
    return smaller if len(pass_schedule(lg, smaller)) < len(pass_schedule(lg, params)) else params


# Bucket accumulation: "xyzz" (msm_accumulate: XYZZ mixed additions), "affine"
# (msm_accumulate_affine: batch-affine rounds sharing an inversion per block, then XYZZ), "grid"
# (grid_affine.cuh: rounds sharing ONE inversion over all their pairs, then XYZZ), "grid-g2"
# (grid for the G2 MSMs, XYZZ for G1) or "auto" (the default: "grid-g2" where the device plan fits
# the rounds' lists as configured, else "xyzz"; the plan decides, plan.plan_device); read when
# MsmParams() is made. Measured on the H200: grid made the G2 MSM at 2^24 6-10 % faster and the G1
# one ~20 % slower (perf/results/gpu-msm-grid-affine-h200.json); the 2^24 partition (B2 with
# multiples), whose G2 MSM runs beside the G1 chain, 2.7-4.3 % faster, and the 2^27 pipeline (no
# multiples; half-size chunks of the lists to fit) 5.6 % slower a partition
# (perf/results/gpu-session-h200-grid-g2.json), and the 2^26 pipeline (no multiples, the lists fit)
# 3.4 % faster a partition (same file). Keys of at most 2^18 rows keep XYZZ whatever the mode
# (SMALL_MSM_PARAMS), and where the rounds' lists do not fit the plan turns them off before it
# drops any multiple.
ACCUMULATE_ENV = "CUZK_GPU_MSM_ACCUMULATE"
ACCUMULATE_MODES = ("auto", "xyzz", "affine", "grid", "grid-g2")
ACCUMULATE_DEFAULT = "auto"
# Batch-affine defaults: 256 entries per thread; 3 rounds (each halves every run): a block of
# 128 threads then shares one inversion among ~16 k, 8 k and 4 k additions, and the runs left
# (1/8 of each) go through XYZZ, where a fourth round would save less than its inversion's latency.
BA_ROUNDS = 3
BA_SEG = 256
# Grid batch-affine: at most GA_ROUNDS rounds (grid_rounds_for picks fewer where the runs are
# short), GA_CHUNK sorted entries at a time (the rounds' lists cost ~2 x 8 AW + 2 CW bytes an
# entry: ~15 GB for G1, ~29 GB for G2 at 2^26), GA_THREADS threads for the denominator and
# sum passes where the occupancy is not known, and GA_INV_FAN elements a thread in each level of
# the inversion tree (each level's threads run chains of that many products: latency).
GA_ROUNDS = 8
GA_CHUNK = 1 << 26
GA_THREADS = 1 << 16
GA_INV_FAN = 8


# Keys up to this domain size skip the 0/1 split: every scalar goes through the Pippenger windows
# (a zero costs a sort key per window, a one a single addition, as in the split), so staging waits
# for nothing (no index lists come back to the host), a proof's MSM is one chain of kernels instead
# of the ones' chain then Pippenger's, and k proofs' MSMs of one section run as ONE batched pass
# (:meth:`.msm._Msm.launch_batch`). Above it the sort of the zeros' keys costs more than the split,
# and the backend may pack a key's sparse B sections (backend.SUPPORT_SECTIONS; the bench's plan
# line says so).
DENSE_KEY_ROWS = 1 << 16

# Keys up to this domain size run each MSM of a pass on its own stream of a per-thread pool of
# MSM_STREAMS (their short, latency-bound kernels side by side); larger keys keep to a thread's two
# streams, G2 on one and the rest in order on the other (each MSM fills the device).
SMALL_KEY_ROWS = 1 << 18
MSM_STREAMS = 8


def batches_msms(domain_size: int, vectors: int, packed: bool) -> bool:
    """Whether the backend runs ``vectors`` MSMs of one key section as ONE batched pass
    (:meth:`.msm._Msm.launch_batch`; else one MSM each): more than one, a key of at most
    :data:`DENSE_KEY_ROWS` rows (dense plans), the section not packed to a support. One rule for the
    backend's ``msm_batch`` and the device plan's scratch."""
    return vectors > 1 and domain_size <= DENSE_KEY_ROWS and not packed


def msm_stream_of(domain_size: int, section: str, i: int) -> str:
    """Which of a thread's streams the i-th MSM of ``section`` in a pass of a key of ``domain_size``
    rows runs on: "main" (a large key's G1 MSMs), "side" (its G2 MSM) or "pool<j>" (a small key's).
    One rule for the backend (which stream it enqueues on) and the device plan (MSMs on one stream
    run one after another and reuse its pool blocks; on distinct streams their scratch is alive
    together)."""
    if domain_size > SMALL_KEY_ROWS:
        return "side" if section == "b2" else "main"
    return f"pool{(SECTIONS.index(section) + len(SECTIONS) * i) % MSM_STREAMS}"

# MsmParams.fq_mul's values, in the order of their EC_FQ_DFMA define (ec/xyzz.cuh).
FQ_MUL_MODES = ("imad", "dfma", "mixed")


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment knob: a default-on knob is off only for "0" / "off" / "false" / "no", a
    default-off knob on only for "1" / "on" / "true" / "yes" (any case, spaces ignored); unset or
    anything else keeps the default."""
    value = os.environ.get(name, "").strip().lower()
    return value not in ("0", "off", "false", "no") if default else value in ("1", "on", "true", "yes")


# "1" / "on" / "true" / "yes" makes MsmParams.g2_split default to True (the G2 level 1 by lane pairs,
# where the XYZZ kernel would run); unset or anything else: False. Read when MsmParams() is made.
G2_SPLIT_ENV = "CUZK_GPU_MSM_G2_SPLIT"


# The sort of window batches with more buckets than the counting sort takes (msm.COUNTING_SORT_BINS):
# "radix" (kernels/msm/sort.cuh, no host wait) or "argsort" (cupy.argsort, which waits for the host inside
# every MSM). Each key's device plan picks it by the key's domain (:func:`large_sort_for`), as measured in
# the PoRep-like pipeline (10 partitions x 2 jobs, key made on the device, every proof verified;
# perf/results/gpu-sort-h200-2026-12-05.json): on the H200 2^26 0.946 s a partition with cupy.argsort
# against 1.026 with the radix sort, 2^27 1.862 with the radix sort against 1.936; on an H100 2^24 0.2540
# against 0.2539 (perf/results/gpu-sort-h100-2026-12-05.json; the radix sort gained at 2^24 on the H200
# when it came). 2^25 is not measured: it goes with 2^26. Env CUZK_GPU_MSM_SORT overrides the rule.
SORT_ENV = "CUZK_GPU_MSM_SORT"
SORT_MODES = ("radix", "argsort")
ARGSORT_DOMAINS = (1 << 25, 1 << 26)  # cupy.argsort for keys of these many rows, the radix sort elsewhere


def sort_default() -> str:
    """The large-batch sort env CUZK_GPU_MSM_SORT names (unset: "radix"); ConfigError for another value."""
    mode = os.environ.get(SORT_ENV, "").strip().lower() or "radix"
    if mode not in SORT_MODES:
        raise ConfigError(f"{SORT_ENV}={mode!r}: one of {', '.join(SORT_MODES)}")
    return mode


def large_sort_for(domain_size: int) -> str:
    """The large-batch sort of a key of ``domain_size`` rows: env CUZK_GPU_MSM_SORT where set, else the
    measured rule (:data:`ARGSORT_DOMAINS`)."""
    if os.environ.get(SORT_ENV, "").strip():
        return sort_default()
    return "argsort" if domain_size in ARGSORT_DOMAINS else "radix"


def g2_split_default() -> bool:
    """Whether env CUZK_GPU_MSM_G2_SPLIT turns the component-split G2 accumulation on (default: off)."""
    return env_switch(G2_SPLIT_ENV, False)


def accumulate_rounds(mode: str | None = None) -> int:
    """Batch-affine rounds of an accumulation mode (``mode`` None: env CUZK_GPU_MSM_ACCUMULATE,
    default :data:`ACCUMULATE_DEFAULT`): :data:`BA_ROUNDS` for "affine", else 0."""
    return BA_ROUNDS if _accumulate_mode(mode) == "affine" else 0


def _accumulate_mode(mode: str | None) -> str:
    mode = ((os.environ.get(ACCUMULATE_ENV) if mode is None else mode) or "").strip().lower() or ACCUMULATE_DEFAULT
    if mode not in ACCUMULATE_MODES:
        raise ConfigError(f"{ACCUMULATE_ENV}={mode!r}: one of {', '.join(ACCUMULATE_MODES)}")
    return mode


def grid_rounds(mode: str | None = None) -> int:
    """Most grid batch-affine rounds of an accumulation mode (as :func:`accumulate_rounds`):
    :data:`GA_ROUNDS` for "grid", "grid-g2" and "auto", else 0."""
    return GA_ROUNDS if _accumulate_mode(mode) in ("grid", "grid-g2", "auto") else 0


def grid_for_g1(mode: str | None = None) -> bool:
    """Whether an accumulation mode's grid rounds (if any) serve G1 MSMs too: not for "grid-g2" and "auto"."""
    return _accumulate_mode(mode) not in ("grid-g2", "auto")


def grid_where_fits(mode: str | None = None) -> bool:
    """Whether an accumulation mode keeps its G2 grid rounds only where the device plan fits their
    lists as configured (its multiples, its partitions in flight) and the key has at most
    :data:`.plan.GRID_AUTO_MAX_DOMAIN` rows, and runs XYZZ elsewhere by rule, not as a fallback
    ("auto"; measured on the H200: 3 % a partition gained at 2^24 and 2^26, 5.6 % lost at 2^27 with
    chunks halved to fit, 7 % lost at 2^27 with whole chunks)."""
    return _accumulate_mode(mode) == "auto"


def grid_rounds_for(n: int, n_buckets: int, most: int) -> int:
    """Grid batch-affine rounds for n sorted entries over n_buckets buckets: each round halves
    every run, so log2 of the mean run (at most ``most``); the XYZZ level 1 sums what is left."""
    mean = n / max(1, min(n_buckets, n))
    return max(0, min(most, int(mean).bit_length() - 1))


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
    # target thread count of the bucket reduction: nb / this buckets a thread, each thread's share
    # ending with a scalar multiplication by its first bucket's index, so fewer, longer chunks pay
    # while the threads still fill the device (2^15 beat 2^16 and 2^17 in the runs above)
    reduce_threads: int = 1 << 15
    # fewest buckets per thread of the bucket reduction (a power of two): a thread's chain is 2 chunk
    # additions plus a ~c-bit scalar multiplication, so small MSMs, whose few threads leave the GPU
    # latency-bound, want short chunks (and small groups, combine_seg); large ones are throughput-bound
    bucket_chunk_min: int = 16
    max_entries: int = 1 << 28  # sort keys alive at once (4 B key + 8 B index each)
    window_bits: int | None = None  # None: choose_window(number of tail scalars); ignored with precomputed multiples
    # Batch-affine accumulation (kernels/msm/batch_affine.cuh): rounds of affine additions
    # sharing one inversion per block before the XYZZ pass; 0 = msm_accumulate alone.
    ba_rounds: int = field(default_factory=accumulate_rounds)
    ba_seg: int = BA_SEG  # sorted entries per thread of the batch-affine kernel
    # Grid batch-affine accumulation (kernels/msm/grid_affine.cuh): at most this many rounds of
    # affine additions sharing one inversion over all their pairs; 0 = off. Beats ba_rounds.
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
    # G1 modules: where the curve formulas' Fq products run (ec/xyzz.cuh, EC_FQ_DFMA): "imad"
    # (mont_t's carry chains), "dfma" (all on the FP64 pipe, ff/fp_dfma.cuh) or "mixed" (fq_mixed_n of
    # the mixed addition's products on the FP64 pipe, the rest on IMAD; fq_fused and fq_calls apply
    # to it as to "imad"); compiled in, only "imad" is shipped (NVRTC builds the others on first
    # use). perf/gpu_msm_notes.md has the measurements.
    fq_mul: str = "imad"
    # with fq_mul "mixed": how many of the mixed addition's products run on the FP64 pipe
    # (ec/xyzz.cuh EC_FQ_MIXED_N: U2, PPP, Q, PP, ZZ3, ZZZ3 in that order)
    fq_mixed_n: int = 4
    # Both groups: Fq products and squares as one Karatsuba level plus a word-by-word reduction
    # (ff/mont.cuh mul_karatsuba, FF_KARATSUBA=1; also the G2 module's lazy Fq2 product) instead
    # of CIOS: 264 instead of 300 32-bit products per Fq multiply. Measured on the H200: the bare
    # multiply 3 % faster, the square 4 % slower, the G1 accumulation at 2^24 16 % slower (the
    # extra additions and moves land on the IMAD pipe too): off.
    fq_karatsuba: bool = False
    # G1 modules with the IMAD (or mixed) product: every formula's Y3 = a b - c d as one CIOS pass with one
    # reduction (ff/mont.cuh mul_add, ec/xyzz.cuh EC_FQ_FUSED=1): 444 instead of 600 products.
    # Measured on the H200 at 2^24 random: accumulation 103.2 ms against 108.9, the MSM 128.6
    # against 135.0 (perf/gpu_msm_notes.md), so it is the default. (The same fusion for G2, as an
    # Fq2 call with two reductions instead of four, was measured 35 % slower and is not kept.)
    fq_fused: bool = True
    # G1 modules with the IMAD (or mixed) product: the formulas' Fq products, squares and fused a b - c d as
    # __noinline__ calls with operands by value (ec/xyzz.cuh EC_FQ_CALLS=1): one bucket step runs
    # through ~42 KB of code instead of ~73 KB, for ~6 % more instructions (the call moves) and
    # ~130 L1-resident local accesses per step (call saves). Measured on the H200 at 2^24 random:
    # the MSM 107.2 ms against 128.4 inlined (accumulation 88.2 / 103.0, reduction 9.2 / 15.6;
    # "no instruction" stalls 31 % -> 6 % of the accumulation's samples), PoRep-like 33.3 / 39.8;
    # with 3, 5 or 6 blocks per SM 89.4 / 91.1 / 95.4 ms of accumulation (perf/gpu_msm_notes.md).
    fq_calls: bool = True
    # G2 level 1 with two lanes per segment (kernels/msm/split.cuh, msm_accumulate_split): lane c of a
    # pair holds component c of every Fq2 value, so each lane carries G1-sized state (Fq calls, one
    # fused Fq product per lane and Fq2 product, partner values by shuffles) instead of one thread
    # with 255 registers and ~1.1 KB of call-save spills at 2 blocks per SM; same heads and buckets
    # as msm_accumulate. Taken where msm_accumulate would be (not with the grid or batch-affine
    # rounds). Measured on the H200 (perf/results/gpu-msm-split-h200.json): accumulation 1-2 % faster,
    # the ones' sum 6 % slower at 2^27, the G2 MSM within 1 %: off (env CUZK_GPU_MSM_G2_SPLIT=1 turns
    # it on). G1 ignores it.
    g2_split: bool = field(default_factory=g2_split_default)
    # msm_accumulate_split's __launch_bounds__ minimum blocks per SM (compiled in, G2 modules; None:
    # the kernel's default, 384 threads a SM: 3 blocks of 128, 168 registers on sm_90)
    split_min_blocks: int | None = None
    # msm_radix_scatter's __launch_bounds__ minimum blocks of 256 per SM (compiled in, both groups; None:
    # the kernel's default, MSM_RADIX_MIN_BLOCKS in msm.cu)
    radix_min_blocks: int | None = None
    # how window batches above the counting sort's buckets are sorted: "radix" or "argsort" (SORT_ENV)
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
        if self.seg < 1 or self.combine_seg < 2 or self.reduce_threads < 1:
            raise ConfigError(f"MsmParams: seg >= 1, combine_seg >= 2, thread counts >= 1 (got {self})")
        if self.window_bits is not None and not 2 <= self.window_bits <= 24:
            raise ConfigError(f"MsmParams.window_bits={self.window_bits}: in [2, 24] (sort key packing)")
        if self.max_entries < 1:
            raise ConfigError(f"MsmParams.max_entries={self.max_entries}: >= 1")
        if self.acc_min_blocks is not None and not 1 <= self.acc_min_blocks <= 32:
            raise ConfigError(f"MsmParams.acc_min_blocks={self.acc_min_blocks}: in [1, 32] or None")
        if self.fq_mul not in FQ_MUL_MODES:
            raise ConfigError(f"MsmParams.fq_mul={self.fq_mul!r}: one of {', '.join(FQ_MUL_MODES)}")
        if not 1 <= self.fq_mixed_n <= 6:
            raise ConfigError(f"MsmParams.fq_mixed_n={self.fq_mixed_n}: in [1, 6]")
        if self.split_min_blocks is not None and not 1 <= self.split_min_blocks <= 16:
            raise ConfigError(f"MsmParams.split_min_blocks={self.split_min_blocks}: in [1, 16] or None")
        if self.large_sort not in SORT_MODES:
            raise ConfigError(f"MsmParams.large_sort={self.large_sort!r}: one of {', '.join(SORT_MODES)}")
        if self.radix_min_blocks is not None and not 1 <= self.radix_min_blocks <= 8:
            raise ConfigError(f"MsmParams.radix_min_blocks={self.radix_min_blocks}: in [1, 8] or None")
        if self.ga_min_blocks is not None and not 1 <= self.ga_min_blocks <= 16:
            raise ConfigError(f"MsmParams.ga_min_blocks={self.ga_min_blocks}: in [1, 16] or None")
        if not 0 <= self.ga_rounds <= 64 or self.ga_chunk < 2 or (self.ga_threads is not None and self.ga_threads < 1):
            raise ConfigError(f"MsmParams: ga_rounds in [0, 64], ga_chunk >= 2, ga_threads >= 1 (got {self.ga_rounds}, "
                              f"{self.ga_chunk}, {self.ga_threads})")
        if not 0 <= self.ba_rounds <= 255 or not 1 <= self.ba_seg <= 1 << 16:
            raise ConfigError(f"MsmParams: ba_rounds in [0, 255], ba_seg in [1, 65536] (got {self.ba_rounds}, "
                              f"{self.ba_seg})")

    def split(self, g2: bool) -> bool:
        """Whether this group's level 1 takes msm_accumulate_split where it would take msm_accumulate."""
        return g2 and self.g2_split

    def grid(self, g2: bool) -> bool:
        """Whether this group's MSMs take the grid batch-affine rounds."""
        return self.ga_rounds > 0 and (g2 or self.ga_g1)

    def defines(self, g2: bool) -> dict[str, int]:
        """The ``-D`` knobs of the kernel module for one group."""
        min_blocks = self.acc_min_blocks or (1 if g2 else max(1, 512 // self.nthreads))
        out = {"MSM_G2": int(g2), "MSM_NTHREADS": self.nthreads, "MSM_ACC_MIN_BLOCKS": min_blocks}
        if g2:
            out.update(G2_FP2)
            if self.split_min_blocks:
                out["MSM_SPLIT_MIN_BLOCKS"] = self.split_min_blocks
        elif self.fq_mul != "imad":
            out["EC_FQ_DFMA"] = FQ_MUL_MODES.index(self.fq_mul)
            if self.fq_mul == "mixed":
                out["EC_FQ_MIXED_N"] = self.fq_mixed_n
        if self.ga_min_blocks:
            out["GA_ADD_MIN_BLOCKS"] = self.ga_min_blocks
        if self.radix_min_blocks:
            out["MSM_RADIX_MIN_BLOCKS"] = self.radix_min_blocks
        if self.fq_karatsuba:
            out["FF_KARATSUBA"] = 1
        if self.fq_fused and not g2 and self.fq_mul != "dfma":
            out["EC_FQ_FUSED"] = 1
        if self.fq_calls and not g2 and self.fq_mul != "dfma":
            out["EC_FQ_CALLS"] = 1
        return out


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

# "0" / "off" / "false" turns the small MSMs' CUDA graphs off (msm_graphs_enabled), e.g. where a
# driver's graph support misbehaves; anything else, or unset, leaves them on.
GRAPHS_ENV = "CUZK_GPU_MSM_GRAPHS"


def msm_graphs_enabled() -> bool:
    """Whether env CUZK_GPU_MSM_GRAPHS leaves the small MSMs' CUDA graphs on (default: on)."""
    return env_switch(GRAPHS_ENV, True)


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


SCALAR_BITS = 256  # windows cover 256 bits: the Booth carry out of bit 254 still fits


def choose_window(m: int) -> int:
    """Window bits for m scalars without precomputed multiples: floor(log2 m) - 4 in [5, 22],
    lowered while one bit fewer needs no more windows.

    A window's cost is m sort keys and mixed additions plus its 2^(c-1) buckets' reduction, so
    a c whose window count c - 1 also gives (17 and 16: 16 windows; 21 and 20: 13; 23 and 22:
    12) only doubles the buckets. Measured on the H200 (random G1, checked,
    perf/results/gpu-msm-windows-h200.json): 2^25 scalars 207.5 ms at c = 20 against 215.7 at
    21 and 219.1 at 22; 2^26 398.2 at 22 against 415.6 at 21; 2^27 771.0 at 22 against 810.7.
    22 caps the bucket memory: at 2^26+ scalars a sort batch holds at most 4 windows
    (``MsmParams.max_entries``), 4 x 2^21 XYZZ buckets: 1.6 GB for G1, 3.2 GB for G2.
    """
    c = min(max(m.bit_length() - 1 - 4, 5), 22)
    while c > 5 and window_count(c - 1) == window_count(c):
        c -= 1
    return c


def window_count(c: int) -> int:
    """Signed c-bit windows needed for scalars below 2^255 (digits.cuh)."""
    return -(-SCALAR_BITS // c)


def choose_multiples_window(n: int) -> int:
    """Window bits for precomputed multiples of n points: the c in [8, 24] that minimises
    the model n W(c) + 3 * 2^c (mixed additions of the accumulation, plus the one shared
    bucket set's reduction: 2^(c-1) buckets x 2 full additions at ~1.5 mixed ones each).
    2^24 points: 22 (12 windows; 13 at c = 20 without multiples), 2^20: 19, 2^16: 16."""
    return min(range(8, 25), key=lambda c: (n * window_count(c) + 3 * (1 << c), c))


def ones_segment(n1: int, resident: int | None, seg: int) -> int:
    """Entries per thread for the sum of the n1 ones: the fewest whole waves of
    ``resident`` threads with at most ``seg`` entries each.

    With a fixed seg the last wave can be nearly empty (G2 at 2^24 PoRep-like:
    6.7 M ones / 64 = 105 k threads = 3.1 waves of 33.8 k, so ~22 % of the ones
    time idles); one segment per thread and wave costs nothing extra. ``resident``
    None (no occupancy figure, e.g. the CPU emulator) keeps ``seg``.
    """
    if not resident:
        return seg
    waves = max(1, -(-n1 // (resident * seg)))
    return max(1, -(-n1 // (waves * resident)))


SECTIONS = ("a", "b1", "b2", "c", "h")
MULTIPLES_ENV = "CUZK_GPU_MSM_MULTIPLES"
# Device memory kept free for partitions in flight and MSM / NTT scratch when the multiples
# tables are planned: a fixed part plus this much per domain row (3 partitions of a, b, c, w
# ~400 B, two concurrent MSMs' sort keys and their sort's scratch ~650 B, NTT tables, slack).
RESERVE_FIXED = 4 << 30
RESERVE_PER_ROW = 1536


def plan_multiples(section_bytes: dict[str, int], free: int, domain_size: int,
                   choice: str | None = None) -> dict[str, int]:
    """Which sections get precomputed multiples, and their window bits.

    ``choice``: "none", "auto" (default) or a comma list of sections. "auto" takes
    sections in the order h, b2, a, b1, c while the tables ((W - 1) more copies of
    the section) leave ``RESERVE_FIXED + RESERVE_PER_ROW * domain_size`` free.
    ``section_bytes``: bytes of each section's points; ``free``: device bytes free
    once the sections are resident.
    """
    choice = (choice or "").strip().lower() or "auto"
    if choice in ("none", "0", "off"):
        return {}
    rows = {name: b // (192 if name == "b2" else 96) for name, b in section_bytes.items()}
    windows = {name: choose_multiples_window(max(1, r)) for name, r in rows.items() if r}
    if choice != "auto":
        picked = [s.strip() for s in choice.split(",") if s.strip()]
        unknown = [s for s in picked if s not in SECTIONS]
        if unknown:
            raise ConfigError(f"{MULTIPLES_ENV}={choice!r}: unknown sections {unknown} (use none, auto or "
                             f"a comma list of {', '.join(SECTIONS)})")
        return {s: windows[s] for s in picked if s in windows}
    budget = free - RESERVE_FIXED - RESERVE_PER_ROW * domain_size
    out: dict[str, int] = {}
    for name in ("h", "b2", "a", "b1", "c"):
        if name not in windows:
            continue
        extra = (window_count(windows[name]) - 1) * section_bytes[name]
        if extra <= budget:
            out[name] = windows[name]
            budget -= extra
    return out


@dataclass(frozen=True)
class FixedBaseParams:
    """Knobs: ``nthreads`` is compiled in (``-DFB_NTHREADS``); the rest is launch geometry."""

    nthreads: int = 128  # threads per block
    per_thread: int = 32  # points per thread (one field inversion each)
    chunk: int = 1 << 22  # rows per launch (bounds device memory)
    # Batches of at least signed_min_rows scalars go through the table of signed windows of wbits
    # bits (16 additions a point instead of the 8-bit table's 32; its 2^15 x 16 rows are made by the
    # 8-bit kernel once per FixedBase, a few ms); smaller ones, and wbits 0, take the 8-bit table.
    wbits: int = 16
    signed_min_rows: int = 1 << 16

    def defines(self, g2: bool) -> dict[str, int]:
        """The ``-D`` knobs of the kernel module for one group."""
        return {"FB_G2": int(g2), "FB_NTHREADS": self.nthreads}



@dataclass(frozen=True)
class Variant:
    """One shipped module variant: kernel file, ``-D`` knobs, SASS targets, group."""

    path: str
    defines: tuple[tuple[str, Any], ...]
    archs: tuple[str, ...]
    group: str

    @property
    def define_dict(self) -> dict[str, Any]:
        """The knobs as a dict."""
        return dict(self.defines)


def _v(path: str, defines: dict[str, Any] | None, group: str, archs: tuple[str, ...] = ALL_ARCHS) -> Variant:
    return Variant(path, tuple(sorted((defines or {}).items())), archs, group)


def check_environment() -> None:
    """ConfigError naming the first CUZK_GPU_* knob with a value its reader would refuse (checked with
    a GPU engine's config, before any prover process starts)."""
    sort_default()
    _accumulate_mode(None)
    plan_multiples({}, 0, 1, os.environ.get(MULTIPLES_ENV))


def _shipped() -> tuple[Variant, ...]:
    ntt_chunk1 = replace(NttParams(), chunk_lg=NttParams().chunk_lg - 1).defines()  # plan_params at 2^19/27/28
    out = [
        _v(NTT_PATH, None, "prover"),
        _v(NTT_PATH, ntt_chunk1, "prover"),
        _v(H_PATH, None, "prover"),
        _v(WITNESS_MAP_PATH, None, "prover"),
        _v(MSM_PATH, _SHIPPED_MSM.defines(False), "prover"),
        _v(MSM_PATH, _SHIPPED_MSM.defines(True), "prover"),
        _v(FB_PATH, FixedBaseParams().defines(False), "setup"),
        _v(FB_PATH, FixedBaseParams().defines(True), "setup"),
    ]
    return tuple(out)


# The MSM modules the package ships: the defaults' compile-time knobs. The fields read from the
# environment (the accumulation, the sort, the G2 split) are launch choices, not defines: given here,
# so that importing this module never reads (or refuses) them.
_SHIPPED_MSM = MsmParams(ba_rounds=0, ga_rounds=0, ga_g1=False, ga_where_fits=False, g2_split=False,
                         large_sort="radix")
SHIPPED: tuple[Variant, ...] = _shipped()


def variants(groups: tuple[str, ...]) -> list[Variant]:
    """The shipped variants of some groups."""
    return [v for v in SHIPPED if v.group in groups]
