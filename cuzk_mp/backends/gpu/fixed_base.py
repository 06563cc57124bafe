"""Batch fixed-base work on the GPU: [s_i * G] for the dev setup, 2^(c w) P_i for the MSM.

Device state: a :class:`FixedBase` owns the window table of its base (32 x 255
affine points: 0.8 MB for G1, 1.6 MB for G2, built on the host with arkworks),
for large batches a table of signed 16-bit windows (2^15 x 16 + 1 points: 50 MB
for G1, 101 MB for G2, made on the device from the first one at the first large
batch: half the additions a point), and the compiled
``kernels/fixed_base/fixed_base.cu``. Scalars are processed in
chunks of ``FixedBaseParams.chunk`` rows, so device memory stays bounded
(per row: 32 B scalar + affine output + 5 coordinates of scratch; 2^22 rows =
1.5 GB for G1, 2.9 GB for G2) whatever the number of scalars.

:func:`fixed_base_g1` / :func:`fixed_base_g2` are the host-array entry points
the backend calls; :meth:`FixedBase.run_device` keeps everything on the device
(used to make large test and benchmark bases). :func:`multiples_table` makes the
MSM's precomputed multiples of resident key points (``fixed_base_pow2``: c
doublings per multiple, affine by the same per-thread Montgomery trick).
"""

from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from ...algebra.curve import g1_ark_to_lem, g2_ark_to_lem
from ...algebra.field import R_MOD, ints_to_limbs
from ...errors import InputError
from .knobs import FB_PATH, FixedBaseParams
from .modules import get_module

__all__ = [
    "FB_PATH",
    "FixedBase",
    "FixedBaseParams",
    "fixed_base_g1",
    "fixed_base_g2",
    "multiples_table",
    "signed_table_scalars",
    "window_table",
]

WBITS, NWIN = 8, 32  # fixed_base.cuh: FB_WBITS, FB_NWIN
ROWS = (1 << WBITS) - 1  # table rows per window (digits 1 .. 255)


def window_table(base: G1Point | G2Point) -> np.ndarray:
    """Rows j * 255 + d - 1 = d 2^(8 j) base, zkey layout: ``(8160, 12)`` or ``(8160, 24)``."""
    to_lem = g2_ark_to_lem if isinstance(base, G2Point) else g1_ark_to_lem
    rows = []
    for j in range(NWIN):
        step = base * Scalar.from_le_bytes((1 << (WBITS * j)).to_bytes(32, "little"))
        acc = step
        for _ in range(ROWS):
            rows.append(to_lem(acc))
            acc = acc + step
    return np.stack(rows)


@functools.lru_cache(maxsize=4)
def signed_table_scalars(wbits: int) -> np.ndarray:
    """The scalars of the signed-window table (fixed_base.cuh, ``fixed_base_signed_body``): row
    j * half + d - 1 = d 2^(wbits j) for j < ceil(256 / wbits) windows and 1 <= d <= half =
    2^(wbits - 1), then 2^(wbits nwin) mod r (the last window's carry); ``(nwin half + 1, 4)``
    uint64. A window whose d 2^(wbits j) could pass 2^256 is reduced mod r (the base has order r)."""
    if not 2 <= wbits <= 16:
        raise ValueError(f"signed fixed-base windows: wbits={wbits}, expected 2..16")
    nwin, half = -(-256 // wbits), 1 << (wbits - 1)
    d = np.arange(1, half + 1, dtype=np.uint64)
    out = np.zeros((nwin * half + 1, 4), dtype=np.uint64)
    for j in range(nwin):
        shift, rows = wbits * j, slice(j * half, (j + 1) * half)
        if shift + wbits > 256:
            out[rows] = ints_to_limbs([(k << shift) % R_MOD for k in range(1, half + 1)], 4)
            continue
        limb, off = divmod(shift, 64)
        out[rows, limb] = d << np.uint64(off)
        if off and limb < 3:
            out[rows, limb + 1] = d >> np.uint64(64 - off)
    out[-1] = ints_to_limbs([(1 << (wbits * nwin)) % R_MOD], 4)[0]
    out.setflags(write=False)  # shared by every caller (cached)
    return out


class FixedBase:
    """s_i * base for batches of scalars, on the current device and stream."""

    def __init__(self, base: G1Point | G2Point, params: FixedBaseParams | None = None) -> None:
        self.params = params or FixedBaseParams()
        self.g2 = isinstance(base, G2Point)
        self.cw = 12 if self.g2 else 6  # uint64 words per coordinate
        self.d_table = cupy.asarray(window_table(base))
        module = get_module(FB_PATH, self.params.defines(self.g2))
        self._kernel = module.get_function("fixed_base_mul")
        self._signed_kernel = module.get_function("fixed_base_signed")
        self._d_signed: Any = None  # the signed-window table, made at the first large batch

    def run_device(self, d_scalars: Any, d_out: Any = None) -> Any:
        """``(n, 2 cw)`` uint64 device array of the products of the ``(n, 4)`` device scalars."""
        n = int(d_scalars.shape[0])
        if d_scalars.dtype != np.uint64 or d_scalars.ndim != 2 or d_scalars.shape[1] != 4:
            raise InputError(f"fixed-base scalars: expected an (n, 4) uint64 array, got {d_scalars.dtype} "
                             f"{tuple(d_scalars.shape)}")
        signed = bool(self.params.wbits) and n >= self.params.signed_min_rows
        if signed and self._d_signed is None:
            self._d_signed = self._run(cupy.asarray(signed_table_scalars(self.params.wbits)), None, signed=False)
        return self._run(d_scalars, d_out, signed)

    def _run(self, d_scalars: Any, d_out: Any, signed: bool) -> Any:
        n = int(d_scalars.shape[0])
        if d_out is None:
            d_out = cupy.empty((n, 2 * self.cw), dtype=np.uint64)
        chunk = min(self.params.chunk, max(n, 1))
        scratch = cupy.empty((chunk, 5 * self.cw), dtype=np.uint64)
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            self._launch(cupy.ascontiguousarray(d_scalars[lo:hi]), d_out[lo:hi], scratch, hi - lo, signed)
        return d_out

    def _launch(self, d_scalars: Any, d_out: Any, scratch: Any, n: int, signed: bool) -> None:
        per, block = self.params.per_thread, self.params.nthreads
        threads = -(-n // per)
        grid = (-(-threads // block),)
        if signed:
            self._signed_kernel(grid, (block,), (d_scalars, self._d_signed, d_out, scratch, np.uint64(n),
                                                 np.uint32(per), np.uint32(self.params.wbits)))
        else:
            self._kernel(grid, (block,), (d_scalars, self.d_table, d_out, scratch, np.uint64(n), np.uint32(per)))

    def run(self, scalars: np.ndarray) -> np.ndarray:
        """Host in, host out, chunk by chunk (device memory bounded by ``params.chunk``)."""
        scalars = np.ascontiguousarray(scalars, dtype=np.uint64)
        if scalars.ndim != 2 or scalars.shape[1] != 4:
            raise InputError(f"fixed-base scalars: expected an (n, 4) uint64 array, got shape {scalars.shape}")
        out = np.empty((scalars.shape[0], 2 * self.cw), dtype=np.uint64)
        for lo in range(0, scalars.shape[0], self.params.chunk):
            hi = min(lo + self.params.chunk, scalars.shape[0])
            out[lo:hi] = cupy.asnumpy(self.run_device(cupy.asarray(scalars[lo:hi])))
        return out


def fixed_base_g1(base: G1Point, scalars: np.ndarray) -> np.ndarray:
    """[s_i * base] as an ``(n, 12)`` zkey-layout array (0 -> the all-zero point)."""
    return FixedBase(base).run(scalars)


def fixed_base_g2(base: G2Point, scalars: np.ndarray) -> np.ndarray:
    """[s_i * base] as an ``(n, 24)`` zkey-layout array (0 -> the all-zero point)."""
    return FixedBase(base).run(scalars)



def multiples_table(d_points: Any, c: int, windows: int, params: FixedBaseParams | None = None) -> Any:
    """``(windows n, AW)`` device table whose rows [w n, (w + 1) n) are 2^(c w) P_i, from the
    ``(n, AW)`` device points P (AW = 12 for G1, 24 for G2; rows [0, n) are a copy of P).
    Scratch is bounded by ``params.chunk`` rows; runs on the current stream."""
    params = params or FixedBaseParams()
    n, aw = int(d_points.shape[0]), int(d_points.shape[1])
    if aw not in (12, 24) or d_points.dtype != np.uint64:
        raise InputError(f"multiples of points: expected an (n, 12) or (n, 24) uint64 array, got "
                         f"{d_points.dtype} {tuple(d_points.shape)}")
    if not 1 <= c <= 32 or windows < 1:
        raise InputError(f"multiples of points: c={c}, windows={windows}")
    kernel = get_module(FB_PATH, params.defines(aw == 24)).get_function("fixed_base_pow2")
    table = cupy.empty((windows * n, aw), dtype=np.uint64)
    table[:n] = d_points
    chunk = min(params.chunk, max(n, 1))
    scratch = cupy.empty((chunk, 5 * (aw // 2)), dtype=np.uint64)
    per, block = params.per_thread, params.nthreads
    for w in range(1, windows):
        for lo in range(0, n, chunk):
            cnt = min(chunk, n - lo)
            threads = -(-cnt // per)
            kernel((-(-threads // block),), (block,), (table[(w - 1) * n + lo:], table[w * n + lo:], scratch,
                                                        np.uint64(cnt), np.uint32(per), np.uint32(c)))
    return table
