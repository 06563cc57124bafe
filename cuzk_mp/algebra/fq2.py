"""Field elements as numba tuples, with one generic API over Fq and Fq2.

The curve code in :mod:`cuzk_mp.algebra.ec` is written once and compiled twice:
for G1 (coordinates in Fq) and for G2 (coordinates in Fq2 = Fq[u]/(u^2 + 1)).
What makes that possible is this module's small set of ``fe_*`` functions,
which numba resolves by the *type* of their arguments at compile time:

* an Fq element is a ``UniTuple(uint64, 6)`` of Montgomery limbs;
* an Fq2 element is a ``UniTuple(UniTuple(uint64, 6), 2)`` = (c0, c1).

Each ``fe_*`` name is a plain-Python placeholder that is only meaningful
inside jitted code (numba ``@overload``). ``like`` arguments are a zero of the
wanted field (:data:`FQ_ZERO`, :data:`FQ2_ZERO`) and only carry its type.

Array rows hold consecutive coordinates: coordinate ``k`` of row ``i`` is
limbs ``[k*w, (k+1)*w)`` with ``w`` = 6 (Fq) or 12 (Fq2, c0 then c1), which
is the zkey point layout (G2: x.c0, x.c1, y.c0, y.c1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.extending import overload

from .fq import ONE_MONT
from .fq_kernels import F
from .jit import njit

FQ_T = types.UniTuple(types.uint64, 6)
FQ2_T = types.UniTuple(FQ_T, 2)
U0 = np.uint64(0)
FQ_ZERO = (U0,) * 6
FQ2_ZERO = (FQ_ZERO, FQ_ZERO)
# 1 in Montgomery form (2^384 mod q), limb by limb, as numba compile-time constants.
_O0, _O1, _O2, _O3, _O4, _O5 = (np.uint64(int(v)) for v in ONE_MONT)

_fmul, _fadd, _fsub, _finv = F.mul, F.add, F.sub, F.inv


# ------------------------------------------------------------------ Fq on tuples


@njit(inline="always")
def fq_mul(a, b):  # type: ignore[no-untyped-def]
    """a*b in Fq (Montgomery tuples)."""
    return _fmul(a[0], a[1], a[2], a[3], a[4], a[5], b[0], b[1], b[2], b[3], b[4], b[5])


@njit(inline="always")
def fq_add(a, b):  # type: ignore[no-untyped-def]
    """a+b in Fq."""
    return _fadd(a[0], a[1], a[2], a[3], a[4], a[5], b[0], b[1], b[2], b[3], b[4], b[5])


@njit(inline="always")
def fq_sub(a, b):  # type: ignore[no-untyped-def]
    """a-b in Fq."""
    return _fsub(a[0], a[1], a[2], a[3], a[4], a[5], b[0], b[1], b[2], b[3], b[4], b[5])


@njit
def fq_inv(a):  # type: ignore[no-untyped-def]
    """a^-1 in Fq (Fermat); 0 gives 0."""
    return _finv(a[0], a[1], a[2], a[3], a[4], a[5])


# ------------------------------------------------------------------ Fq2 = Fq[u]/(u^2+1)


@njit
def fq2_mul(a, b):  # type: ignore[no-untyped-def]
    """Karatsuba: (a0 + a1 u)(b0 + b1 u) = (a0b0 - a1b1) + ((a0+a1)(b0+b1) - a0b0 - a1b1) u; 3M."""
    t0 = fq_mul(a[0], b[0])
    t1 = fq_mul(a[1], b[1])
    t2 = fq_mul(fq_add(a[0], a[1]), fq_add(b[0], b[1]))
    return fq_sub(t0, t1), fq_sub(fq_sub(t2, t0), t1)


@njit
def fq2_sqr(a):  # type: ignore[no-untyped-def]
    """Complex squaring: (a0 + a1 u)^2 = (a0 + a1)(a0 - a1) + 2 a0 a1 u; 2M."""
    t = fq_mul(a[0], a[1])
    return fq_mul(fq_add(a[0], a[1]), fq_sub(a[0], a[1])), fq_add(t, t)


@njit
def fq2_inv(a):  # type: ignore[no-untyped-def]
    """(a0 + a1 u)^-1 = (a0 - a1 u) / (a0^2 + a1^2); one Fq inversion. 0 gives 0."""
    t = fq_inv(fq_add(fq_mul(a[0], a[0]), fq_mul(a[1], a[1])))
    return fq_mul(a[0], t), fq_sub(FQ_ZERO, fq_mul(a[1], t))


# ------------------------------------------------------------------ generic fe_* API


def fe_mul(a: Any, b: Any) -> Any:
    """a*b (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_sqr(a: Any) -> Any:
    """a^2 (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_add(a: Any, b: Any) -> Any:
    """a+b (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_sub(a: Any, b: Any) -> Any:
    """a-b (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_inv(a: Any) -> Any:
    """a^-1, 0 for 0 (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_is_zero(a: Any) -> Any:
    """a == 0 (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_zero(like: Any) -> Any:
    """0 of like's field (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_one(like: Any) -> Any:
    """1 (Montgomery form) of like's field (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_load(arr: Any, i: Any, k: Any, like: Any) -> Any:
    """Coordinate k of row i of a limb array (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def fe_store(arr: Any, i: Any, k: Any, v: Any) -> None:
    """Write v as coordinate k of row i (jitted code only)."""
    raise TypeError("fe_* functions are for numba-compiled code")


def _pick(t: Any, fq_impl: Any, fq2_impl: Any) -> Any:
    if t == FQ_T:
        return fq_impl
    if t == FQ2_T:
        return fq2_impl
    return None


@overload(fe_mul)
def _ov_mul(a, b):  # type: ignore[no-untyped-def]
    return _pick(a, lambda a, b: fq_mul(a, b), lambda a, b: fq2_mul(a, b))


@overload(fe_sqr)
def _ov_sqr(a):  # type: ignore[no-untyped-def]
    return _pick(a, lambda a: fq_mul(a, a), lambda a: fq2_sqr(a))


@overload(fe_add)
def _ov_add(a, b):  # type: ignore[no-untyped-def]
    return _pick(a, lambda a, b: fq_add(a, b), lambda a, b: (fq_add(a[0], b[0]), fq_add(a[1], b[1])))


@overload(fe_sub)
def _ov_sub(a, b):  # type: ignore[no-untyped-def]
    return _pick(a, lambda a, b: fq_sub(a, b), lambda a, b: (fq_sub(a[0], b[0]), fq_sub(a[1], b[1])))


@overload(fe_inv)
def _ov_inv(a):  # type: ignore[no-untyped-def]
    return _pick(a, lambda a: fq_inv(a), lambda a: fq2_inv(a))


@overload(fe_is_zero)
def _ov_is_zero(a):  # type: ignore[no-untyped-def]
    def fq(a):  # type: ignore[no-untyped-def]
        return (a[0] | a[1] | a[2] | a[3] | a[4] | a[5]) == U0

    def fq2(a):  # type: ignore[no-untyped-def]
        b, c = a[0], a[1]
        return (b[0] | b[1] | b[2] | b[3] | b[4] | b[5] | c[0] | c[1] | c[2] | c[3] | c[4] | c[5]) == U0

    return _pick(a, fq, fq2)


@overload(fe_zero)
def _ov_zero(like):  # type: ignore[no-untyped-def]
    def fq(like):  # type: ignore[no-untyped-def]
        return (U0, U0, U0, U0, U0, U0)

    def fq2(like):  # type: ignore[no-untyped-def]
        return (U0, U0, U0, U0, U0, U0), (U0, U0, U0, U0, U0, U0)

    return _pick(like, fq, fq2)


@overload(fe_one)
def _ov_one(like):  # type: ignore[no-untyped-def]
    def fq(like):  # type: ignore[no-untyped-def]
        return (_O0, _O1, _O2, _O3, _O4, _O5)

    def fq2(like):  # type: ignore[no-untyped-def]
        return (_O0, _O1, _O2, _O3, _O4, _O5), (U0, U0, U0, U0, U0, U0)

    return _pick(like, fq, fq2)


@njit(inline="always")
def _load6(arr, i, o):  # type: ignore[no-untyped-def]
    return arr[i, o], arr[i, o + 1], arr[i, o + 2], arr[i, o + 3], arr[i, o + 4], arr[i, o + 5]


@njit(inline="always")
def _store6(arr, i, o, v):  # type: ignore[no-untyped-def]
    arr[i, o], arr[i, o + 1], arr[i, o + 2], arr[i, o + 3], arr[i, o + 4], arr[i, o + 5] = v


@overload(fe_load)
def _ov_load(arr, i, k, like):  # type: ignore[no-untyped-def]
    return _pick(
        like,
        lambda arr, i, k, like: _load6(arr, i, 6 * k),
        lambda arr, i, k, like: (_load6(arr, i, 12 * k), _load6(arr, i, 12 * k + 6)),
    )


@overload(fe_store)
def _ov_store(arr, i, k, v):  # type: ignore[no-untyped-def]
    def fq(arr, i, k, v):  # type: ignore[no-untyped-def]
        _store6(arr, i, 6 * k, v)

    def fq2(arr, i, k, v):  # type: ignore[no-untyped-def]
        _store6(arr, i, 12 * k, v[0])
        _store6(arr, i, 12 * k + 6, v[1])

    return _pick(v, fq, fq2)
