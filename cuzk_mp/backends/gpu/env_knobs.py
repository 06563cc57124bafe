"""The CUZK_GPU_* environment knobs of the MSM, and their readers.

Why a module of its own: these are the only knobs an operator sets from outside (the bucket
accumulation, the large-batch sort, the small MSMs' CUDA graphs, a one-shot's exit hand-off, the
shipped kernel binaries), and a GPU engine
checks them all before any prover process starts, as a one-shot verb's backend does before its
key's upload (:func:`check_environment`: values, and names no reader has). An
:class:`.msm_params.MsmParams` reads its defaults from them when it is made; nothing here reads the
environment at import. No CuPy here.
"""

from __future__ import annotations

import os

from ...errors import ConfigError
from .msm_geometry import MULTIPLES_ENV, plan_multiples


# Bucket accumulation: "xyzz" (msm_accumulate: XYZZ mixed additions), "grid"
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
ACCUMULATE_MODES = ("auto", "xyzz", "grid", "grid-g2")
ACCUMULATE_DEFAULT = "auto"
# Grid batch-affine: at most GA_ROUNDS rounds (grid_rounds_for picks fewer where the runs are
# short), GA_CHUNK sorted entries at a time (the rounds' lists cost ~2 x 8 AW + 2 CW bytes an
# entry: ~15 GB for G1, ~29 GB for G2 at 2^26), GA_THREADS threads for the denominator and
# sum passes where the occupancy is not known, and GA_INV_FAN elements a thread in each level of
# the inversion tree (each level's threads run chains of that many products: latency).
GA_ROUNDS = 8
GA_CHUNK = 1 << 26
GA_THREADS = 1 << 16
GA_INV_FAN = 8


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment knob: a default-on knob is off only for "0" / "off" / "false" / "no", a
    default-off knob on only for "1" / "on" / "true" / "yes" (any case, spaces ignored); unset or
    anything else keeps the default."""
    value = os.environ.get(name, "").strip().lower()
    return value not in ("0", "off", "false", "no") if default else value in ("1", "on", "true", "yes")


# The sort of window batches the counting sort does not take (msm_passes.counting_sort_takes):
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


def _accumulate_mode(mode: str | None) -> str:
    mode = ((os.environ.get(ACCUMULATE_ENV) if mode is None else mode) or "").strip().lower() or ACCUMULATE_DEFAULT
    if mode not in ACCUMULATE_MODES:
        raise ConfigError(f"{ACCUMULATE_ENV}={mode!r}: one of {', '.join(ACCUMULATE_MODES)}")
    return mode


def grid_rounds(mode: str | None = None) -> int:
    """Most grid batch-affine rounds of an accumulation mode (``mode`` None: env
    CUZK_GPU_MSM_ACCUMULATE, default :data:`ACCUMULATE_DEFAULT`):
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


# "0" / "off" / "false" turns the small MSMs' CUDA graphs off (msm_graphs_enabled), e.g. where a
# driver's graph support misbehaves; anything else, or unset, leaves them on.
GRAPHS_ENV = "CUZK_GPU_MSM_GRAPHS"


def msm_graphs_enabled() -> bool:
    """Whether env CUZK_GPU_MSM_GRAPHS leaves the small MSMs' CUDA graphs on (default: on)."""
    return env_switch(GRAPHS_ENV, True)


# "0" / "off" / "false" / "no": a one-shot GPU verb releases its CUDA context itself at exit
# (early_context.hand_off_teardown); read there.
EXIT_HANDOFF_ENV = "CUZK_GPU_EXIT_HANDOFF"

# Which shipped kernel binaries a process loads (bin_sets.load_order, read by modules.get_module):
# "auto" (the default: nvcc 13's fatbins on a driver of CUDA 13 or later, NVRTC 12.9's cubins below
# it), "fatbin" or "cuda12" (that set alone, e.g. to test one on a device), "nvrtc" (none: every
# module compiled by CuPy's NVRTC, for a driver that misreads the shipped code).
BINARIES_ENV = "CUZK_GPU_BINARIES"
BINARIES_MODES = ("auto", "fatbin", "cuda12", "nvrtc")


def binaries_mode() -> str:
    """The shipped-binary choice env CUZK_GPU_BINARIES names (unset: "auto"); ConfigError for another value."""
    mode = os.environ.get(BINARIES_ENV, "").strip().lower() or "auto"
    if mode not in BINARIES_MODES:
        raise ConfigError(f"{BINARIES_ENV}={mode!r}: one of {', '.join(BINARIES_MODES)}")
    return mode


# Every CUZK_GPU_* variable a reader has: any other is refused by check_environment (a misspelt
# knob, or one of a variant the package does not ship, would otherwise be ignored in silence).
KNOWN_ENV = tuple(sorted((ACCUMULATE_ENV, BINARIES_ENV, EXIT_HANDOFF_ENV, GRAPHS_ENV, MULTIPLES_ENV, SORT_ENV)))


def check_environment() -> None:
    """ConfigError naming the first CUZK_GPU_* variable that no reader has, or the first knob with a
    value its reader would refuse (checked with a GPU engine's config, before any prover process starts)."""
    for name in sorted(os.environ):
        if name.startswith("CUZK_GPU_") and name not in KNOWN_ENV:
            raise ConfigError(f"{name}: no such knob ({', '.join(KNOWN_ENV)})")
    sort_default()
    binaries_mode()
    _accumulate_mode(None)
    plan_multiples({}, 0, 1, os.environ.get(MULTIPLES_ENV))
