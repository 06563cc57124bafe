"""numba kernels of :mod:`cuzk_mp.algebra.fq`: the vector loops over ``(n, 6) uint64`` Fq arrays.

Kept apart from the Python API so that importing :mod:`.fq` (and :mod:`.curve`, which converts
single points through it) costs no numba. ``F`` is the inline namespace (``mul, add, sub,
is_zero, lt_modulus`` from :func:`cuzk_mp.algebra.mont.generate`, plus ``neg`` and ``inv``
defined here) that the curve kernels in :mod:`cuzk_mp.algebra.ec` build on. Compiled on first
use and cached on disk.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from . import mont
from .field import FQ, Q_MOD
from .jit import njit, prange

_G = mont.generate(FQ)
fmul = _G.mul
fadd = _G.add
fsub = _G.sub
U0 = np.uint64(0)
# Fermat inversion exponent q - 2, as bits from the most significant one down.
_INV_BITS = np.array([int(c) for c in bin(Q_MOD - 2)[2:]], dtype=np.uint8)


@njit(inline="always")
def _neg(a0, a1, a2, a3, a4, a5):  # type: ignore[no-untyped-def]
    return fsub(U0, U0, U0, U0, U0, U0, a0, a1, a2, a3, a4, a5)


@njit(cache=True)
def _inv(a0, a1, a2, a3, a4, a5):  # type: ignore[no-untyped-def]
    # a^(q-2) by left-to-right square-and-multiply (Fermat): 380 squarings + ~190 mults.
    # The inverse of 0 comes out as 0 (callers that care check is_zero first).
    r0, r1, r2, r3, r4, r5 = a0, a1, a2, a3, a4, a5
    for k in range(1, _INV_BITS.shape[0]):
        r0, r1, r2, r3, r4, r5 = fmul(r0, r1, r2, r3, r4, r5, r0, r1, r2, r3, r4, r5)
        if _INV_BITS[k]:
            r0, r1, r2, r3, r4, r5 = fmul(r0, r1, r2, r3, r4, r5, a0, a1, a2, a3, a4, a5)
    return r0, r1, r2, r3, r4, r5


F = SimpleNamespace(mul=fmul, add=fadd, sub=fsub, is_zero=_G.is_zero, lt_modulus=_G.lt_modulus, neg=_neg, inv=_inv)


@njit(parallel=True, cache=True)
def _vmul(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = fmul(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], a[i, 4], a[i, 5], b[i, 0], b[i, 1], b[i, 2], b[i, 3], b[i, 4], b[i, 5])


@njit(parallel=True, cache=True)
def _vmul_scalar(a, c, out):  # type: ignore[no-untyped-def]
    c0, c1, c2, c3, c4, c5 = c[0], c[1], c[2], c[3], c[4], c[5]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = fmul(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], a[i, 4], a[i, 5], c0, c1, c2, c3, c4, c5)


@njit(parallel=True, cache=True)
def _vadd(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = fadd(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], a[i, 4], a[i, 5], b[i, 0], b[i, 1], b[i, 2], b[i, 3], b[i, 4], b[i, 5])


@njit(parallel=True, cache=True)
def _vsub(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = fsub(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], a[i, 4], a[i, 5], b[i, 0], b[i, 1], b[i, 2], b[i, 3], b[i, 4], b[i, 5])


@njit(parallel=True, cache=True)
def _vinv(a, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4], out[i, 5] = _inv(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], a[i, 4], a[i, 5])
