"""numba kernels of :mod:`cuzk_mp.algebra.fr`: the vector loops over ``(n, 4) uint64`` Fr arrays.

Kept apart from the Python API so that importing :mod:`.fr` costs no numba: a process that never
runs an Fr vector loop on the host (a one-shot GPU proof) never loads numba. ``F`` (with
``fmul, fadd, fsub, fredc``) is the inline namespace of :func:`cuzk_mp.algebra.mont.generate`
that other modules' kernels build on. Compiled on first use and cached on disk.
"""

from __future__ import annotations

import numpy as np

from . import mont
from .field import FR
from .jit import njit, prange

ONE_MONT = FR.one_limbs
F = mont.generate(FR)
fmul = F.mul
fadd = F.add
fsub = F.sub
fredc = F.redc


@njit(parallel=True, cache=True)
def _vmul(a, b, out):  # type: ignore[no-untyped-def]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fmul(
            a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], b[i, 2], b[i, 3])


@njit(parallel=True, nogil=True, cache=True)
def _vmul_scalar(a, c, out):  # type: ignore[no-untyped-def]
    c0, c1, c2, c3 = c[0], c[1], c[2], c[3]
    for i in prange(a.shape[0]):
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = fmul(a[i, 0], a[i, 1], a[i, 2], a[i, 3], c0, c1, c2, c3)


@njit(parallel=True, nogil=True, cache=True)
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


@njit(parallel=True, nogil=True, cache=True)
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


@njit(parallel=True, nogil=True, cache=True)
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


@njit(parallel=True, nogil=True, cache=True)
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
