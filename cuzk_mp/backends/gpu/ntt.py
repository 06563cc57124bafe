"""NTTs over Fr on the GPU and the fused H step, with twiddle tables resident per size.

Conventions match :mod:`cuzk_mp.algebra.ntt` (the CPU oracle): forward
A_k = sum_j a_j w^(jk), w = ``fr_root_of_unity(lg)``, natural order in and out,
Montgomery form; the inverse uses w^-1 and scales by 1/n.

How the work is split (kernels/ntt/ntt.cu has the math):
* :func:`.knobs.pass_schedule` cuts the lg index bits into passes of k bits; each pass
  is one launch over shared-memory tiles (one read and one write of the array).
  The low pass takes up to ``2^tile_lg`` contiguous elements, the others k <=
  tile_lg - chunk_lg bits with 2^chunk_lg contiguous rows per access. With the
  default knobs 2^11 .. 2^19 take 2 passes and 2^20 .. 2^28 three (2^19, 2^27 and
  2^28 with chunk 1, see plan_params).
* iNTT runs decimation-in-frequency (natural in, bit-reversed out) and NTT runs
  decimation-in-time (bit-reversed in, natural out), so the H step needs no
  permutation pass; the stand-alone transforms add one in-place bit reversal.

Tables per size stay resident once built, until released (the backend releases a
domain's when its last key closes): w^i for i < n/2 (16 n bytes, shared by both
directions; expanded on the device from a two-level table made with Python ints),
the small sub-DFT tables of each direction, and a two-level table
(lo[e mod 2^b] * hi[e >> b]) of the coset factors g^e / n.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

import cupy
import numpy as np

from ...algebra.field import FR, R_MOD, coset_shift, fr_root_of_unity, ints_to_limbs, log2_exact
from ...errors import GpuDead, InputError
from . import memory
from .knobs import H_PATH, NTT_PATH, NttParams, pass_schedule, plan_params
from .knobs import NTT_KERNEL_DEFAULTS as KERNEL_DEFAULTS
from .modules import get_function

__all__ = ["KERNEL_DEFAULTS", "MAX_LG", "GpuNtt", "NttParams", "NttPlan", "pass_schedule", "plan_params"]

DEFAULT_PARAMS = NttParams()
MAX_LG = 28  # 2^28 rows: uint32 element indices in the kernels stay < 2^32


def _powers(base: int, count: int, start: int = 1) -> list[int]:
    out, x = [], start % R_MOD
    for _ in range(count):
        out.append(x)
        x = x * base % R_MOD
    return out


def _two_level(root: int, lg: int, hi_scale: int = 1) -> tuple[list[int], list[int], int]:
    """(lo, hi, b): root^E = lo[E mod 2^b] * hi[E >> b] for E < 2^lg; hi also times hi_scale."""
    b = (lg + 1) // 2
    return _powers(root, 1 << b), _powers(pow(root, 1 << b, R_MOD), 1 << (lg - b), hi_scale), b


def twiddle_ints(lg: int, inverse: bool, params: NttParams = DEFAULT_PARAMS) -> dict[str, Any]:
    """Tables of one size and direction as standard-form ints: the two-level form of the
    FORWARD root's powers (expanded into the half table on the device) and the sub-DFT
    twiddles of this direction."""
    root = fr_root_of_unity(lg)
    lo, hi, b = _two_level(root, lg)
    if inverse:
        root = pow(root, -1, R_MOD)
    in_lg = min(lg, params.tile_lg)
    tw_in = _powers(pow(root, 1 << (lg - in_lg), R_MOD), max(1, 1 << (in_lg - 1)))
    return {"tw_lo": lo, "tw_hi": hi, "tw_b": b, "tw_in": tw_in, "in_lg": in_lg}


def coset_ints(lg: int) -> dict[str, Any]:
    """Two-level table of g^e / n (g = ``coset_shift(lg)``): the iNTT's 1/n folded in."""
    lo, hi, b = _two_level(coset_shift(lg), lg, hi_scale=pow(1 << lg, -1, R_MOD))
    return {"co_lo": lo, "co_hi": hi, "co_b": b}


def _to_device(xs: list[int]) -> Any:
    return cupy.asarray(ints_to_limbs([FR.to_mont_int(x) for x in xs], 4))


def launch(kernel: Any, grid: int, block: int, args: tuple[Any, ...], what: str) -> None:
    """Launch one kernel; a CUDA error comes back as GpuDead naming kernel, grid, block and sizes."""
    try:
        kernel((grid,), (block,), args)
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
        raise GpuDead(f"{getattr(kernel, 'name', 'kernel')} grid={grid} block={block} ({what}) failed: {exc}") from exc


class NttPlan:
    """Device tables of one transform size (both directions and the coset), built once."""

    def __init__(self, lg: int, params: NttParams, expand: Any) -> None:
        self.lg = lg
        self.params = plan_params(lg, params)
        self.pass_kernel = get_function(NTT_PATH, "ntt_pass", self.params.defines())
        self.passes = pass_schedule(lg, self.params)
        half = max(1, 1 << (lg - 1))
        memory.ensure_free(half * 32, f"the 2^{lg} NTT twiddle table")
        self.tables: dict[bool, dict[str, Any]] = {}
        for inverse in (False, True):
            t = twiddle_ints(lg, inverse, params)
            self.tables[inverse] = {"tw_in": _to_device(t["tw_in"]), "in_lg": t["in_lg"]}
        lo, hi = _to_device(t["tw_lo"]), _to_device(t["tw_hi"])
        self.tw_half = cupy.empty((half, 4), dtype=np.uint64)
        launch(expand, -(-half // params.threads), params.threads,
               (self.tw_half, np.uint32(half), lo, hi, np.uint32(t["tw_b"])), f"2^{lg} twiddle table")
        c = coset_ints(lg)
        self.coset = {k: (_to_device(v) if isinstance(v, list) else v) for k, v in c.items()}
        self.inv_n = _to_device([pow(1 << lg, -1, R_MOD)])
        arrays = [self.tw_half, self.inv_n, *(t["tw_in"] for t in self.tables.values())]
        arrays += [a for a in self.coset.values() if isinstance(a, cupy.ndarray)]
        self.nbytes = sum(int(a.nbytes) for a in arrays)
        # Built on the current stream; other threads' streams use the tables next: finish them now.
        cupy.cuda.get_current_stream().synchronize()


class GpuNtt:
    """Launches the NTT kernels of one device; plans are cached per size."""

    def __init__(self, params: NttParams = DEFAULT_PARAMS) -> None:
        self.params = params
        self._plans: dict[int, NttPlan] = {}
        self._lock = threading.Lock()
        self._bitrev = get_function(NTT_PATH, "ntt_bit_reverse", params.defines())
        self._expand = get_function(NTT_PATH, "ntt_expand_powers", params.defines())
        self._combine = get_function(H_PATH, "h_combine")

    def plan(self, lg: int) -> NttPlan:
        """The (cached) tables for a 2^lg transform on the current device."""
        if not 1 <= lg <= MAX_LG:
            raise InputError(f"NTT size 2^{lg} is outside 2^1 .. 2^{MAX_LG}")
        with self._lock:
            if lg not in self._plans:
                self._plans[lg] = NttPlan(lg, self.params, self._expand)
            return self._plans[lg]

    def domain_sizes(self) -> list[int]:
        """The transform sizes whose tables are on the device (kept until :meth:`release`)."""
        with self._lock:
            return [1 << lg for lg in self._plans]

    def release(self, domain_size: int) -> None:
        """Free the tables of ``domain_size`` transforms (nothing if none are built); a later
        transform of that size builds them again. The device is synchronized before the tables go
        back to CuPy's pool: a kernel enqueued with them (an H step not yet run) reads them first,
        and the pool may hand their blocks to another stream's next allocation. The caller makes
        sure no more such work comes while they go (the backend: when no resident key has that
        domain; its stand-alone transforms are synchronous)."""
        lg = domain_size.bit_length() - 1
        with self._lock:
            plan = self._plans.pop(lg, None) if domain_size == 1 << lg else None
        if plan is not None:
            cupy.cuda.Device().synchronize()
            del plan

    def _check(self, d_x: Any) -> int:
        if d_x.dtype != np.uint64 or d_x.ndim != 2 or d_x.shape[1] != 4 or not d_x.flags.c_contiguous:
            raise InputError(f"expected a C-contiguous (n, 4) uint64 device array, got {d_x.dtype} {d_x.shape}")
        n = int(d_x.shape[0])
        if n & (n - 1) or n == 0:
            raise InputError(f"NTT length {n} is not a power of two")
        return log2_exact(n)

    def _run_passes(self, d_x: Any, plan: NttPlan, dit: bool, inverse: bool, coset: bool) -> None:
        t = plan.tables[inverse]
        passes = plan.passes if dit else plan.passes[::-1]
        co = plan.coset
        for s_lo, k in passes:
            c_lg = min(s_lo, plan.params.chunk_lg)
            grid = (1 << plan.lg) >> (k + c_lg)
            use_co = int(coset and s_lo == 0)
            launch(plan.pass_kernel, grid, self.params.threads, (
                d_x, np.uint32(plan.lg), np.uint32(s_lo), np.uint32(k), np.uint32(dit), np.uint32(inverse),
                plan.tw_half, t["tw_in"], np.uint32(t["in_lg"]),
                np.uint32(use_co), co["co_lo"], co["co_hi"], np.uint32(co["co_b"])),
                f"2^{plan.lg} pass s_lo={s_lo} k={k} dit={dit}")

    def _bit_reverse(self, d_x: Any, plan: NttPlan, scale: bool) -> None:
        n = 1 << plan.lg
        grid = -(-n // self.params.threads)
        launch(self._bitrev, grid, self.params.threads, (d_x, np.uint32(plan.lg), np.uint32(scale), plan.inv_n),
               f"2^{plan.lg} bit reversal")

    def ntt_in_place(self, d_x: Any, inverse: bool = False, stream: Any = None) -> Any:
        """Natural-order NTT (or iNTT with the 1/n) of a device (n, 4) array, in place."""
        lg = self._check(d_x)
        if lg == 0:
            return d_x
        plan = self.plan(lg)
        with stream if stream is not None else nullcontext():
            if inverse:
                self._run_passes(d_x, plan, dit=False, inverse=True, coset=False)
                self._bit_reverse(d_x, plan, scale=True)
            else:
                self._bit_reverse(d_x, plan, scale=False)
                self._run_passes(d_x, plan, dit=True, inverse=False, coset=False)
        return d_x

    def to_odd_coset_in_place(self, d_x: Any, stream: Any = None) -> Any:
        """Domain values -> values on the odd coset (iNTT, times g^i / n, NTT), in place."""
        lg = self._check(d_x)
        if lg == 0:
            raise InputError("the H step needs a domain of at least 2 rows")
        plan = self.plan(lg)
        with stream if stream is not None else nullcontext():
            self._run_passes(d_x, plan, dit=False, inverse=True, coset=True)
            self._run_passes(d_x, plan, dit=True, inverse=False, coset=False)
        return d_x

    def coset_h_in_place(self, d_a: Any, d_b: Any, d_c: Any, stream: Any = None) -> Any:
        """p = A*B - C on the odd coset, standard form, written over ``d_a`` (b, c are clobbered)."""
        n = int(d_a.shape[0])
        if d_b.shape != d_a.shape or d_c.shape != d_a.shape:
            raise InputError(f"a, b, c must have the same shape: {d_a.shape} {d_b.shape} {d_c.shape}")
        for d in (d_a, d_b, d_c):
            self.to_odd_coset_in_place(d, stream)
        with stream if stream is not None else nullcontext():
            grid = -(-n // 256)
            launch(self._combine, grid, 256, (d_a, d_b, d_c, d_a, np.uint64(n)), f"n={n}")
        return d_a

