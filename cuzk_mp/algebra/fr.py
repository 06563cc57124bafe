"""Vector arithmetic over Fr (BLS12-381 scalar field).

Arrays are ``(n, 4) uint64``, little-endian limbs, in Montgomery form unless a
function says otherwise. Every function returns a new array (``*_into``
variants write into ``out``). The loops are numba kernels (:mod:`.fr_kernels`), run in parallel
over numba's thread pool (``NUMBA_NUM_THREADS``), cached on disk after the first compile and
imported at their first call: importing this module loads no numba.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from .field import FR, R_MOD, first_not_below, int_to_limbs, ints_to_limbs, limbs_to_ints

NL = 4
ONE_MONT = FR.one_limbs
_R2 = int_to_limbs(FR.r2, NL)


# ------------------------------------------------------------------ Python API


def _k() -> ModuleType:
    """The kernels module (numba is imported with it, at the first call that needs a loop)."""
    from . import fr_kernels

    return fr_kernels


def _check(a: np.ndarray) -> np.ndarray:
    if a.dtype != np.uint64 or a.ndim != 2 or a.shape[1] != NL:
        raise ValueError(f"expected an (n, 4) uint64 Fr array, got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def const(x: int) -> np.ndarray:
    """A single Fr constant in Montgomery form, as a ``(4,)`` uint64 row."""
    return int_to_limbs(FR.to_mont_int(x % R_MOD), NL)


def from_ints(xs: list[int] | tuple[int, ...], mont: bool = True) -> np.ndarray:
    """Python ints -> ``(n, 4)`` array (Montgomery form unless ``mont=False``)."""
    xs = [x % R_MOD for x in xs]
    return ints_to_limbs([FR.to_mont_int(x) for x in xs] if mont else xs, NL)


def to_ints(a: np.ndarray, mont: bool = True) -> list[int]:
    """``(n, 4)`` array -> Python ints (leaving Montgomery form unless ``mont=False``)."""
    vals = limbs_to_ints(a)
    return [FR.from_mont_int(v) for v in vals] if mont else vals


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a*b (Montgomery inputs give Montgomery output)."""
    out = np.empty_like(_check(a))
    _k()._vmul(a, _check(b), out)
    return out


def mul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Elementwise a*b written into ``out`` (may alias ``a`` or ``b``)."""
    _k()._vmul(_check(a), _check(b), out)
    return out


def scale(a: np.ndarray, c: int) -> np.ndarray:
    """a * c for an int constant c (Montgomery in, Montgomery out)."""
    out = np.empty_like(_check(a))
    _k()._vmul_scalar(a, const(c), out)
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a+b."""
    out = np.empty_like(_check(a))
    _k()._vadd(a, _check(b), out)
    return out


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a-b."""
    out = np.empty_like(_check(a))
    _k()._vsub(a, _check(b), out)
    return out


def mul_sub(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Elementwise a*b - c (the Groth16 ``joinABC`` step)."""
    out = np.empty_like(_check(a))
    _k()._vmul_sub(a, _check(b), _check(c), out)
    return out


def to_mont(a: np.ndarray) -> np.ndarray:
    """Standard form -> Montgomery form (multiply by R^2, one Montgomery reduction)."""
    out = np.empty_like(_check(a))
    _k()._vmul_scalar(a, _R2, out)
    return out


def from_mont(a: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form (one Montgomery reduction)."""
    out = np.empty_like(_check(a))
    _k()._vredc(a, out)
    return out


def from_mont_into(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form into ``out`` (``out`` may be ``a``: converts in place)."""
    _k()._vredc(_check(a), out)
    return out


def first_noncanonical(a: np.ndarray) -> int:
    """Index of the first element >= r, or -1 when every element is canonical (numpy: no numba)."""
    if a.dtype != np.uint64 or a.ndim != 2 or a.shape[1] != NL:
        raise ValueError(f"expected an (n, 4) uint64 Fr array, got {a.dtype} {a.shape}")
    return first_not_below(a, FR.limbs)


def powers(base: int, n: int, start: int = 1) -> np.ndarray:
    """[start * base^i for i < n] in Montgomery form (parallel over chunks)."""
    out = np.empty((n, NL), dtype=np.uint64)
    if n == 0:
        return out
    chunk = max(1024, -(-n // 64))
    nchunks = -(-n // chunk)
    step = pow(base, chunk, R_MOD)
    starts, s = [], start % R_MOD
    for _ in range(nchunks):
        starts.append(s)
        s = s * step % R_MOD
    _k()._powers_chunks(const(base), from_ints(starts), out, chunk)
    return out


def batch_inverse(a: np.ndarray) -> np.ndarray:
    """Elementwise inverse (Montgomery in/out). Raises ValueError if any element is 0."""
    a = _check(a)
    n = a.shape[0]
    out = np.empty_like(a)
    if n == 0:
        return out
    chunk = max(1024, -(-n // 64))
    nchunks = -(-n // chunk)
    totals = to_ints(_k()._chunk_products(a, chunk, nchunks))
    if any(t == 0 for t in totals):
        raise ValueError("batch_inverse: an element is 0")
    _k()._batch_inverse_chunks(a, out, chunk, from_ints([pow(t, -1, R_MOD) for t in totals]))
    return out


def csr_matvec(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Sparse (CSR) matrix times vector over Fr.

    ``data`` and ``w`` are Fr arrays; the product of the two forms is what comes
    out (e.g. zkey coefficients are v*R^2, so with a standard-form witness the
    result is in Montgomery form; snarkjs ``buildABC``).
    """
    out = np.empty((indptr.shape[0] - 1, NL), dtype=np.uint64)
    _k()._csr_matvec(indptr, indices, _check(data), _check(w), out)
    return out


def csr_rmatvec(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, w: np.ndarray, n_cols: int,
                tasks: int | None = None) -> np.ndarray:
    """The transposed product: ``out[j] = sum_r M[r, j] w[r]`` for the CSR matrix M, ``(n_cols, 4)``.

    Linear in the entries and parallel over column ranges of about equal entry counts (each
    thread reads every column index and keeps its own range's), with no transposed copy of M.
    Forms multiply as in :func:`csr_matvec`. ``w`` needs at least M's row count of entries.
    ``tasks``: the number of column ranges (default: one per pool thread, one for small M).
    """
    w = _check(w)
    if w.shape[0] < indptr.shape[0] - 1:
        raise ValueError(f"vector has {w.shape[0]} entries, matrix has {indptr.shape[0] - 1} rows")
    out = np.empty((n_cols, NL), dtype=np.uint64)
    _k()._csr_rmatvec(indptr, indices, _check(data), w, column_bounds(indices, n_cols, tasks), out)
    return out


def column_bounds(indices: np.ndarray, n_cols: int, tasks: int | None) -> np.ndarray:
    """``tasks`` column ranges (bounds), split where a sample of ``indices`` has equal counts."""
    import numba

    if tasks is None:
        tasks = min(numba.get_num_threads(), max(1, indices.shape[0] >> 16))
    if tasks <= 1 or n_cols == 0 or indices.shape[0] == 0:
        return np.array([0, n_cols], dtype=np.int64)
    sample = np.sort(indices[:: max(1, indices.shape[0] >> 16)].astype(np.int64))
    cuts = sample[(np.arange(1, tasks) * sample.shape[0]) // tasks]
    return np.concatenate([[0], np.clip(cuts, 0, n_cols), [n_cols]]).astype(np.int64)


def add_scaled2_into(out: np.ndarray, a: np.ndarray, ca: int, b: np.ndarray, cb: int) -> np.ndarray:
    """``out += ca a + cb b`` in place for int constants (one pass, no temporaries; forms as in :func:`scale`)."""
    _k()._vadd_scaled2(_check(a), const(ca), _check(b), const(cb), out)
    return out


def scalar_sub(c: int, a: np.ndarray) -> np.ndarray:
    """``c - a`` elementwise for an int constant c (Montgomery in, Montgomery out)."""
    out = np.empty_like(_check(a))
    _k()._scalar_sub(const(c), a, out)
    return out


def geometric_ratios(tau: int, factor: int, w: int, start: int, n: int, *, mont: bool = True) -> np.ndarray:
    """``factor * x_i / (tau - x_i)`` for ``x_i = start * w^i``, ``i < n`` (e.g. Lagrange values at tau
    over a coset of roots of unity), in Montgomery form, or standard form when ``mont=False``.

    Written as ``factor tau / (tau - x_i) - factor`` and fused into one batch inversion: per element
    five multiplications (the powers, the prefix products and the walk back, with the constant
    folded into each chunk's inverted total), where powers, subtraction, inversion and two scalings
    as separate passes take seven and five more memory passes. ValueError when some x_i = tau.
    """
    out = np.empty((n, NL), dtype=np.uint64)
    if n == 0:
        return out
    chunk = max(1024, -(-n // 64))
    nchunks = -(-n // chunk)
    step = pow(w, chunk, R_MOD)
    starts, s = [], start % R_MOD
    for _ in range(nchunks):
        starts.append(s)
        s = s * step % R_MOD
    totals = np.empty((nchunks, NL), dtype=np.uint64)
    ends = np.empty((nchunks, NL), dtype=np.uint64)
    tau_m = const(tau)
    _k()._ratios_forward(tau_m, const(w), from_ints(starts), chunk, n, out, totals, ends)
    total_ints = to_ints(totals)
    if any(t == 0 for t in total_ints):
        raise ValueError("geometric_ratios: tau is one of the points")
    k = factor * tau % R_MOD
    inv_totals = [k * pow(t, -1, R_MOD) % R_MOD for t in total_ints]
    # standard-form constants make every product with them come out in standard form
    consts = from_ints(inv_totals + [factor]) if mont else ints_to_limbs([x % R_MOD for x in inv_totals + [factor]], NL)
    _k()._ratios_backward(tau_m, const(pow(w, -1, R_MOD)), ends, np.ascontiguousarray(consts[:-1]), consts[-1], chunk,
                          out)
    return out
