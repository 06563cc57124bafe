"""Vector arithmetic over Fq (the BLS12-381 base field).

Arrays are ``(n, 6) uint64``, little-endian limbs, in Montgomery form (x R mod q,
R = 2^384: the zkey's "LEM" coordinates) unless a function says otherwise.
Every function returns a new array. The loops are numba kernels (:mod:`.fq_kernels`, with the
inline namespace ``F`` that the curve kernels build on), run in parallel over numba's thread
pool, cached on disk after the first compile and imported at their first call: importing this
module loads no numba.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from .field import FQ, Q_MOD, first_not_below, int_to_limbs, ints_to_limbs, limbs_to_ints

NL = 6
ONE_MONT = FQ.one_limbs  # 1 in Montgomery form = 2^384 mod q
_R2 = int_to_limbs(FQ.r2, NL)  # 2^768 mod q: mont_mul(x, R^2) = x R
_ONE_STD = int_to_limbs(1, NL)  # mont_mul(xR, 1) = x


# ------------------------------------------------------------------ Python API


def _k() -> ModuleType:
    """The kernels module (numba is imported with it, at the first call that needs a loop)."""
    from . import fq_kernels

    return fq_kernels


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
    _k()._vmul(a, _check(b), out)
    return out


def scale(a: np.ndarray, c: int) -> np.ndarray:
    """a * c for an int constant c (Montgomery in, Montgomery out)."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vmul_scalar(a, const(c), out)
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a+b."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vadd(a, _check(b), out)
    return out


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a-b."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vsub(a, _check(b), out)
    return out


def inv(a: np.ndarray) -> np.ndarray:
    """Elementwise inverse by Fermat (a^(q-2)); 0 maps to 0. Slow: for chunk totals, not bulk."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vinv(a, out)
    return out


def to_mont(a: np.ndarray) -> np.ndarray:
    """Standard form -> Montgomery form (multiply by R^2, one Montgomery reduction)."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vmul_scalar(a, _R2, out)
    return out


def from_mont(a: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form (multiply by 1)."""
    a = _check(a)
    out = np.empty_like(a)
    _k()._vmul_scalar(a, _ONE_STD, out)
    return out


def first_noncanonical(a: np.ndarray) -> int:
    """Index of the first element >= q, or -1 when every element is canonical."""
    return first_not_below(_check(a), FQ.limbs)
