"""Vector arithmetic over Fr (BLS12-381 scalar field) as numba kernels.

Arrays are ``(n, 4) uint64``, little-endian limbs, in Montgomery form unless a
function says otherwise. Every function returns a new array (``*_into``
variants write into ``out``). Kernels run in parallel over numba's thread pool
(``NUMBA_NUM_THREADS``) and are cached on disk after the first compile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import mont
from .field import FR, R_MOD, int_to_limbs, ints_to_limbs, limbs_to_ints

F = mont.generate(FR)
fmul = F.mul
fadd = F.add
fsub = F.sub
fredc = F.redc
NL = 4
ONE_MONT = int_to_limbs(FR.r_mod, NL)
_R2 = int_to_limbs(FR.r2, NL)
_SCAN_BLOCK = 1 << 14


@njit(parallel=True, cache=True)
def _vmul(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fmul(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], b[i, 2], b[i, 3])


@njit(parallel=True, cache=True)
def _vmul_scalar(a, c, out):  # type: ignore[no-untyped-def]
    c0, c1, c2, c3 = c[0], c[1], c[2], c[3]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fmul(a[i, 0], a[i, 1], a[i, 2], a[i, 3], c0, c1, c2, c3)


@njit(parallel=True, cache=True)
def _vredc(a, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fredc(a[i, 0], a[i, 1], a[i, 2], a[i, 3])


@njit(parallel=True, cache=True)
def _vadd(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fadd(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], b[i, 2], b[i, 3])


@njit(parallel=True, cache=True)
def _vsub(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fsub(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], b[i, 2], b[i, 3])


@njit(parallel=True, cache=True)
def _vmul_sub(a, b, c, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        p0, p1, p2, p3 = fmul(a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], b[i, 2], b[i, 3])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fsub(p0, p1, p2, p3, c[i, 0], c[i, 1], c[i, 2], c[i, 3])


@njit(cache=True)
def _powers_serial(w, start, out, lo, hi):  # type: ignore[no-untyped-def]
    o0, o1, o2, o3 = start[0], start[1], start[2], start[3]
    for i in range(lo, hi):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = o0, o1, o2, o3
        o0, o1, o2, o3 = fmul(o0, o1, o2, o3, w[0], w[1], w[2], w[3])


@njit(parallel=True, cache=True)
def _powers_chunks(w, starts, out, chunk):  # type: ignore[no-untyped-def]
    n = out.shape[0]
    for c in prange(starts.shape[0]):
        lo = c * chunk
        hi = min(n, lo + chunk)
        _powers_serial(w, starts[c], out, lo, hi)


@njit(cache=True)
def _batch_inverse_serial(a, out, lo, hi, inv_total):  # type: ignore[no-untyped-def]
    # Montgomery's trick over a[lo:hi]: prefix products, one inversion (given), walk back.
    acc0, acc1, acc2, acc3 = ONE_MONT[0], ONE_MONT[1], ONE_MONT[2], ONE_MONT[3]
    for i in range(lo, hi):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = acc0, acc1, acc2, acc3
        acc0, acc1, acc2, acc3 = fmul(acc0, acc1, acc2, acc3, a[i, 0], a[i, 1], a[i, 2], a[i, 3])
    t0, t1, t2, t3 = inv_total[0], inv_total[1], inv_total[2], inv_total[3]
    for i in range(hi - 1, lo - 1, -1):
        x0, x1, x2, x3 = fmul(t0, t1, t2, t3, out[i, 0], out[i, 1], out[i, 2], out[i, 3])
        t0, t1, t2, t3 = fmul(t0, t1, t2, t3, a[i, 0], a[i, 1], a[i, 2], a[i, 3])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = x0, x1, x2, x3


@njit(cache=True)
def _product(a, lo, hi):  # type: ignore[no-untyped-def]
    acc0, acc1, acc2, acc3 = ONE_MONT[0], ONE_MONT[1], ONE_MONT[2], ONE_MONT[3]
    for i in range(lo, hi):
        acc0, acc1, acc2, acc3 = fmul(acc0, acc1, acc2, acc3, a[i, 0], a[i, 1], a[i, 2], a[i, 3])
    return np.array([acc0, acc1, acc2, acc3], dtype=np.uint64)


@njit(parallel=True, cache=True)
def _chunk_products(a, chunk, nchunks):  # type: ignore[no-untyped-def]
    out = np.empty((nchunks, 4), dtype=np.uint64)
    n = a.shape[0]
    for c in prange(nchunks):
        out[c] = _product(a, c * chunk, min(n, (c + 1) * chunk))
    return out


@njit(parallel=True, cache=True)
def _batch_inverse_chunks(a, out, chunk, inv_totals):  # type: ignore[no-untyped-def]
    n = a.shape[0]
    for c in prange(inv_totals.shape[0]):
        _batch_inverse_serial(a, out, c * chunk, min(n, (c + 1) * chunk), inv_totals[c])


@njit(parallel=True, cache=True)
def _first_noncanonical(a, r, block, first):  # type: ignore[no-untyped-def]
    n = a.shape[0]
    for blk in prange(first.shape[0]):
        first[blk] = -1
        for i in range(blk * block, min(n, (blk + 1) * block)):
            below = False
            for j in range(NL - 1, -1, -1):
                if a[i, j] != r[j]:
                    below = a[i, j] < r[j]
                    break
            if not below:
                first[blk] = i
                break


@njit(parallel=True, cache=True)
def _csr_matvec(indptr, indices, data, w, out):  # type: ignore[no-untyped-def]
    for r in prange(indptr.shape[0] - 1):
        s0 = s1 = s2 = s3 = np.uint64(0)
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k]
            p0, p1, p2, p3 = fmul(data[k, 0], data[k, 1], data[k, 2], data[k, 3], w[c, 0], w[c, 1], w[c, 2], w[c, 3])
            s0, s1, s2, s3 = fadd(s0, s1, s2, s3, p0, p1, p2, p3)
        out[r, 0], out[r, 1], out[r, 2], out[r, 3] = s0, s1, s2, s3


@njit(parallel=True, cache=True)
def _csr_rmatvec(indptr, indices, data, w, bounds, out):  # type: ignore[no-untyped-def]
    # out[j] = sum_r M[r, j] w[r]. Task t owns the output rows (columns of M) bounds[t] .. bounds[t+1]-1:
    # it scans every entry and keeps its own, so no two tasks write one output row (no transpose, no atomics).
    for t in prange(bounds.shape[0] - 1):
        lo, hi = bounds[t], bounds[t + 1]
        for j in range(lo, hi):
            out[j, 0] = out[j, 1] = out[j, 2] = out[j, 3] = 0
        for r in range(indptr.shape[0] - 1):
            for k in range(indptr[r], indptr[r + 1]):
                c = np.int64(indices[k])
                if c >= lo and c < hi:
                    p0, p1, p2, p3 = fmul(data[k, 0], data[k, 1], data[k, 2], data[k, 3],
                                          w[r, 0], w[r, 1], w[r, 2], w[r, 3])
                    out[c, 0], out[c, 1], out[c, 2], out[c, 3] = fadd(
                        out[c, 0], out[c, 1], out[c, 2], out[c, 3], p0, p1, p2, p3)


@njit(parallel=True, cache=True)
def _vadd_scaled2(a, ca, b, cb, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        x0, x1, x2, x3 = fmul(a[i, 0], a[i, 1], a[i, 2], a[i, 3], ca[0], ca[1], ca[2], ca[3])
        y0, y1, y2, y3 = fmul(b[i, 0], b[i, 1], b[i, 2], b[i, 3], cb[0], cb[1], cb[2], cb[3])
        x0, x1, x2, x3 = fadd(x0, x1, x2, x3, y0, y1, y2, y3)
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fadd(x0, x1, x2, x3, out[i, 0], out[i, 1], out[i, 2], out[i, 3])


@njit(parallel=True, cache=True)
def _scalar_sub(c, a, out):  # type: ignore[no-untyped-def]
    c0, c1, c2, c3 = c[0], c[1], c[2], c[3]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fsub(c0, c1, c2, c3, a[i, 0], a[i, 1], a[i, 2], a[i, 3])


@njit(parallel=True, cache=True)
def _ratios_forward(tau, w, starts, chunk, n, prefix, totals, ends):  # type: ignore[no-untyped-def]
    # per chunk: x_i = start w^i, d_i = tau - x_i; prefix[i] = product of the chunk's d before i
    for c in prange(starts.shape[0]):
        x0, x1, x2, x3 = starts[c, 0], starts[c, 1], starts[c, 2], starts[c, 3]
        a0, a1, a2, a3 = ONE_MONT[0], ONE_MONT[1], ONE_MONT[2], ONE_MONT[3]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            prefix[i, 0], prefix[i, 1], prefix[i, 2], prefix[i, 3] = a0, a1, a2, a3
            d0, d1, d2, d3 = fsub(tau[0], tau[1], tau[2], tau[3], x0, x1, x2, x3)
            a0, a1, a2, a3 = fmul(a0, a1, a2, a3, d0, d1, d2, d3)
            x0, x1, x2, x3 = fmul(x0, x1, x2, x3, w[0], w[1], w[2], w[3])
        totals[c, 0], totals[c, 1], totals[c, 2], totals[c, 3] = a0, a1, a2, a3
        ends[c, 0], ends[c, 1], ends[c, 2], ends[c, 3] = x0, x1, x2, x3


@njit(parallel=True, cache=True)
def _ratios_backward(tau, w_inv, ends, inv_totals, shift, chunk, out):  # type: ignore[no-untyped-def]
    # out[i] = inv_total * prefix[i] * (the chunk's d after i) - shift = K / d_i - shift (out holds prefix)
    n = out.shape[0]
    for c in prange(ends.shape[0]):
        x0, x1, x2, x3 = ends[c, 0], ends[c, 1], ends[c, 2], ends[c, 3]
        t0, t1, t2, t3 = inv_totals[c, 0], inv_totals[c, 1], inv_totals[c, 2], inv_totals[c, 3]
        for i in range(min(n, (c + 1) * chunk) - 1, c * chunk - 1, -1):
            x0, x1, x2, x3 = fmul(x0, x1, x2, x3, w_inv[0], w_inv[1], w_inv[2], w_inv[3])
            d0, d1, d2, d3 = fsub(tau[0], tau[1], tau[2], tau[3], x0, x1, x2, x3)
            v0, v1, v2, v3 = fmul(t0, t1, t2, t3, out[i, 0], out[i, 1], out[i, 2], out[i, 3])
            t0, t1, t2, t3 = fmul(t0, t1, t2, t3, d0, d1, d2, d3)
            out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fsub(v0, v1, v2, v3, shift[0], shift[1], shift[2], shift[3])


# ------------------------------------------------------------------ Python API


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
    _vmul(a, _check(b), out)
    return out


def mul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Elementwise a*b written into ``out`` (may alias ``a`` or ``b``)."""
    _vmul(_check(a), _check(b), out)
    return out


def scale(a: np.ndarray, c: int) -> np.ndarray:
    """a * c for an int constant c (Montgomery in, Montgomery out)."""
    out = np.empty_like(_check(a))
    _vmul_scalar(a, const(c), out)
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a+b."""
    out = np.empty_like(_check(a))
    _vadd(a, _check(b), out)
    return out


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a-b."""
    out = np.empty_like(_check(a))
    _vsub(a, _check(b), out)
    return out


def mul_sub(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Elementwise a*b - c (the Groth16 ``joinABC`` step)."""
    out = np.empty_like(_check(a))
    _vmul_sub(a, _check(b), _check(c), out)
    return out


def to_mont(a: np.ndarray) -> np.ndarray:
    """Standard form -> Montgomery form (multiply by R^2, one Montgomery reduction)."""
    out = np.empty_like(_check(a))
    _vmul_scalar(a, _R2, out)
    return out


def from_mont(a: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form (one Montgomery reduction)."""
    out = np.empty_like(_check(a))
    _vredc(a, out)
    return out


def from_mont_into(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Montgomery form -> standard form into ``out`` (``out`` may be ``a``: converts in place)."""
    _vredc(_check(a), out)
    return out


def first_noncanonical(a: np.ndarray) -> int:
    """Index of the first element >= r, or -1 when every element is canonical (parallel over blocks)."""
    if a.dtype != np.uint64 or a.ndim != 2 or a.shape[1] != NL:
        raise ValueError(f"expected an (n, 4) uint64 Fr array, got {a.dtype} {a.shape}")
    first = np.empty(max(1, -(-a.shape[0] // _SCAN_BLOCK)), dtype=np.int64)
    _first_noncanonical(a, FR.limbs, _SCAN_BLOCK, first)
    bad = first[first >= 0]
    return int(bad[0]) if bad.size else -1


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
    _powers_chunks(const(base), from_ints(starts), out, chunk)
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
    totals = to_ints(_chunk_products(a, chunk, nchunks))
    if any(t == 0 for t in totals):
        raise ValueError("batch_inverse: an element is 0")
    _batch_inverse_chunks(a, out, chunk, from_ints([pow(t, -1, R_MOD) for t in totals]))
    return out


def csr_matvec(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Sparse (CSR) matrix times vector over Fr.

    ``data`` and ``w`` are Fr arrays; the product of the two forms is what comes
    out (e.g. zkey coefficients are v*R^2, so with a standard-form witness the
    result is in Montgomery form; snarkjs ``buildABC``).
    """
    out = np.empty((indptr.shape[0] - 1, NL), dtype=np.uint64)
    _csr_matvec(indptr, indices, _check(data), _check(w), out)
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
    _csr_rmatvec(indptr, indices, _check(data), w, column_bounds(indices, n_cols, tasks), out)
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
    _vadd_scaled2(_check(a), const(ca), _check(b), const(cb), out)
    return out


def scalar_sub(c: int, a: np.ndarray) -> np.ndarray:
    """``c - a`` elementwise for an int constant c (Montgomery in, Montgomery out)."""
    out = np.empty_like(_check(a))
    _scalar_sub(const(c), a, out)
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
    _ratios_forward(tau_m, const(w), from_ints(starts), chunk, n, out, totals, ends)
    total_ints = to_ints(totals)
    if any(t == 0 for t in total_ints):
        raise ValueError("geometric_ratios: tau is one of the points")
    k = factor * tau % R_MOD
    inv_totals = [k * pow(t, -1, R_MOD) % R_MOD for t in total_ints]
    # standard-form constants make every product with them come out in standard form
    consts = from_ints(inv_totals + [factor]) if mont else ints_to_limbs([x % R_MOD for x in inv_totals + [factor]], NL)
    _ratios_backward(tau_m, const(pow(w, -1, R_MOD)), ends, np.ascontiguousarray(consts[:-1]), consts[-1], chunk, out)
    return out
