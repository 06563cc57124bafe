"""Knobs of the kernel modules: compile-time defines, launch geometry and the module variants
the package ships compiled.

Each kernel module is one translation unit (:mod:`.source`) compiled with ``-D``
knobs; a (module, knobs) pair is a *variant*. :data:`SHIPPED` lists the variants
built ahead of time by ``scripts/build_kernels.py`` into ``kernels/bin`` (a fatbin
per variant with machine code for the listed architectures), which
:mod:`.modules` loads instead of compiling. No CuPy here: the build script and
the CI check of the shipped binaries import this on machines without a GPU.

The NTT's and the fixed-base kernels' knobs live here; the MSM's are
:class:`.msm_params.MsmParams`, its environment knobs :mod:`.env_knobs`, and its geometry
(window sizes, which key sections get precomputed multiples) :mod:`.msm_geometry`.

Groups: ``prover`` (what a prover process loads before it reports READY) and
``setup`` (the dev setup's fixed-base kernels, also used for the MSM's
precomputed multiples).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .msm_params import MsmParams

# Every GPU generation the prover supports, as SASS targets: A100 (sm_80), the RTX 30 / A-series
# (sm_86), the RTX 40 / L4 / L40 (sm_89), H100 / H200 (sm_90), B200 (sm_100; B300's sm_103 runs it)
# and the RTX 50 / RTX PRO Blackwell cards (sm_120; sm_121 runs it), the class of the production
# PoRep prover's box. A device runs the code of the highest of these with its major and a minor no
# higher than its own (sass_for); any other device compiles with NVRTC.
ALL_ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")


def _capability(arch: str) -> tuple[int, int]:
    """(major, minor) of an nvcc SASS target: ``"sm_86"`` -> (8, 6), ``"sm_120"`` -> (12, 0)."""
    digits = arch.removeprefix("sm_")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not a SASS target: {arch!r}")
    return int(digits[:-1]), int(digits[-1])


def sass_for(arch: str, archs: tuple[str, ...] | list[str]) -> str | None:
    """The target of ``archs`` whose machine code a device of ``arch`` runs, or None: CUDA runs a
    cubin on devices of its major compute capability and a minor no lower than its own (sm_80
    code on an sm_86 or sm_87 device, sm_100 on sm_103, sm_120 on sm_121), so the exact target
    where shipped, else the highest such one (the driver makes the same choice within a fatbin)."""
    major, minor = _capability(arch)
    fits = [a for a in archs if _capability(a)[0] == major and _capability(a)[1] <= minor]
    return max(fits, key=_capability, default=None)


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
# environment (the accumulation, the sort) are launch choices, not defines: given here,
# so that importing this module never reads (or refuses) them.
_SHIPPED_MSM = MsmParams(ga_rounds=0, ga_g1=False, ga_where_fits=False, large_sort="radix")
SHIPPED: tuple[Variant, ...] = _shipped()


def variants(groups: tuple[str, ...]) -> list[Variant]:
    """The shipped variants of some groups."""
    return [v for v in SHIPPED if v.group in groups]
