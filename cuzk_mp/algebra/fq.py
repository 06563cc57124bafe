"""Vector arithmetic over Fq (the BLS12-381 base field) as numba kernels.

Arrays are ``(n, 6) uint64``, little-endian limbs, in Montgomery form (x R mod q,
R = 2^384: the zkey's "LEM" coordinates) unless a function says otherwise.
Every function returns a new array. Kernels run in parallel over numba's thread
pool and are cached on disk after the first compile.

``F`` is the inline namespace (``mul, add, sub, is_zero, lt_modulus`` from
:func:`cuzk_mp.algebra.mont.generate`, plus ``neg`` and ``inv`` defined here)
that the curve kernels in :mod:`cuzk_mp.algebra.ec` build on.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import njit, prange

from . import mont
from .field import FQ, Q_MOD, first_not_below, int_to_limbs, ints_to_limbs, limbs_to_ints

_G = mont.generate(FQ)
fmul = _G.mul
fadd = _G.add
fsub = _G.sub
NL = 6
U0 = np.uint64(0)
ONE_MONT = int_to_limbs(FQ.r_mod, NL)  # 1 in Montgomery form = 2^384 mod q
_R2 = int_to_limbs(FQ.r2, NL)  # 2^768 mod q: mont_mul(x, R^2) = x R
_ONE_STD = int_to_limbs(1, NL)  # mont_mul(xR, 1) = x
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


# ------------------------------------------------------------------ Python API


def _check(a: np.ndarray) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.uint64 or a.ndim != 2 or a.shape[1] != NL:
        raise ValueError(f"expected an (n, 6) uint64 Fq array, got {getattr(a, 'dtype', type(a))} {np.shape(a)}")
    return np.ascontiguousarray(a)


def const(x: int) -> np.ndarray:
    """A single Fq constant in Montgomery form, as a ``(6,)`` uint64 row."""
    return int_to_limbs(FQ.to_mont_int(x % Q_MOD), NL)


def from_ints(xs: list[int] | tuple[int, ...], mont: bool = True) -> np.ndarray:
    """Python ints -> ``(n, 6)`` array (Montgomery form unless ``mont=False``)."""
    xs = [x % Q_MOD for x in xs]
    return ints_to_limbs([FQ.to_mont_int(x) for x in xs] if mont else xs, NL).reshape(-1, NL)


def to_ints(a: np.ndarray, mont: bool = True) -> list[int]:
    """``(n, 6)`` array -> Python ints (leaving Montgomery form unless ``mont=False``)."""
    vals = limbs_to_ints(a)
    return [FQ.from_mont_int(v) for v in vals] if mont else vals


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a*b (Montgomery inputs give Montgomery output)."""
    a = _check(a)
    out = np.empty_like(a)
    _vmul(a, _check(b), out)
    return out


def scale(a: np.ndarray, c: int) -> np.ndarray:
    """a * c for an int constant c (Montgomery in, Montgomery out)."""
    a = _check(a)
    out = np.empty_like(a)
    _vmul_scalar(a, const(c), out)
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a+b."""
    a = _check(a)
    out = np.empty_like(a)
    _vadd(a, _check(b), out)
    return out


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a-b."""
    a = _check(a)
    out = np.empty_like(a)
    _vsub(a, _check(b), out)
    return out


def inv(a: np.ndarray) -> np.ndarray:
    """Elementwise inverse by Fermat (a^(q-2)); 0 maps to 0. Slow: for chunk totals, not bulk."""
    a = _check(a)
    out = np.empty_like(a)
    _vinv(a, out)
    return out


def to_mont(a: np.ndarray) -> np.ndarray:
    """Standard form -> Montgomery form (multiply by R^2, one Montgomery reduction)."""
    a = _check(a)
    out = np.empty_like(a)
    _vmul_scalar(a, _R2, out)
    return out


def from_mont(a: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form (multiply by 1)."""
    a = _check(a)
    out = np.empty_like(a)
    _vmul_scalar(a, _ONE_STD, out)
    return out


def first_noncanonical(a: np.ndarray) -> int:
    """Index of the first element >= q, or -1 when every element is canonical."""
    return first_not_below(_check(a), FQ.limbs)
