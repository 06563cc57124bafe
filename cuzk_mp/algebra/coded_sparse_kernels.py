"""numba kernels of :mod:`cuzk_mp.algebra.coded_sparse`: the witness map, the transposed product
and the distinct-values hash set over coded rows.

Kept apart from the matrices and their Python API so that importing :mod:`.coded_sparse` (the
GPU backend's witness map holds :class:`~cuzk_mp.algebra.coded_sparse.CodedMatrix` rows and
runs them on the device) costs no numba. Compiled on first use and cached on disk.

The witness map (``_evaluate``) inlines ``_row_value`` and its field products for each of the three
matrices, and numba takes 21-27 s to compile that on a 2-core VM (a first CPU proof compiles a dozen
other kernels in under 2 s each). Forms that compile faster evaluate slower (``perf/witness_map_forms.py``,
`perf/results/witness-map-compile-cpu-2026-12-07.json`, 2^20 PoRep-like): ``_row_value`` as a call
compiles in 4 s but evaluates 37-54 % slower, inlined once in a loop over the three matrices in 8-9 s
but 6-13 % slower. The compile is paid once a machine (at install, by ``scripts/warm_caches.py``), the
evaluation by every partition: the inlined form stays.
"""

from __future__ import annotations

import numpy as np

from . import fr_kernels
from .field import FR, int_to_limbs
from .jit import njit, prange
from .row_codes import CODE_MINUS_ONE, CODE_ONE

fmul = fr_kernels.F.mul
fadd = fr_kernels.F.add
fsub = fr_kernels.F.sub
U0 = np.uint64(0)
R2_LIMBS = int_to_limbs(FR.r2, 4)
_EMPTY = np.int64(-1)


@njit(inline="always")
def _row_value(ptr, cols, codes, r, w, tmont, tr2):  # type: ignore[no-untyped-def]
    """<row r, w> in Montgomery form (coefficients v, standard-form w): sum v w R; 0 past the last row."""
    m0 = m1 = m2 = m3 = U0
    if r >= ptr.shape[0] - 1:
        return m0, m1, m2, m3
    s0 = s1 = s2 = s3 = U0
    has_s = False
    for k in range(ptr[r], ptr[r + 1]):
        j = cols[k]
        c = codes[k]
        w0, w1, w2, w3 = w[j, 0], w[j, 1], w[j, 2], w[j, 3]
        if (w1 | w2 | w3) == U0 and w0 <= np.uint64(1):
            if w0 != U0:
                m0, m1, m2, m3 = fadd(m0, m1, m2, m3, tmont[c, 0], tmont[c, 1], tmont[c, 2], tmont[c, 3])
        elif c == CODE_ONE:
            s0, s1, s2, s3 = fadd(s0, s1, s2, s3, w0, w1, w2, w3)
            has_s = True
        elif c == CODE_MINUS_ONE:
            s0, s1, s2, s3 = fsub(s0, s1, s2, s3, w0, w1, w2, w3)
            has_s = True
        else:
            p0, p1, p2, p3 = fmul(tr2[c, 0], tr2[c, 1], tr2[c, 2], tr2[c, 3], w0, w1, w2, w3)
            m0, m1, m2, m3 = fadd(m0, m1, m2, m3, p0, p1, p2, p3)
    if has_s:
        p0, p1, p2, p3 = fmul(s0, s1, s2, s3, R2_LIMBS[0], R2_LIMBS[1], R2_LIMBS[2], R2_LIMBS[3])
        m0, m1, m2, m3 = fadd(m0, m1, m2, m3, p0, p1, p2, p3)
    return m0, m1, m2, m3


@njit(parallel=True, nogil=True, cache=True)
def _evaluate(a_ptr, a_col, a_code, b_ptr, b_col, b_code, c_ptr, c_col, c_code, tmont, tr2, w,  # type: ignore[no-untyped-def]
              out_a, out_b, out_c, block, first_bad, n_bad):
    n = out_a.shape[0]
    n_check = c_ptr.shape[0] - 1
    for blk in prange(first_bad.shape[0]):
        lo = blk * block
        hi = min(n, lo + block)
        fb = _EMPTY
        nb = 0
        for r in range(lo, hi):
            a0, a1, a2, a3 = _row_value(a_ptr, a_col, a_code, r, w, tmont, tr2)
            b0, b1, b2, b3 = _row_value(b_ptr, b_col, b_code, r, w, tmont, tr2)
            c0, c1, c2, c3 = fmul(a0, a1, a2, a3, b0, b1, b2, b3)
            out_a[r, 0], out_a[r, 1], out_a[r, 2], out_a[r, 3] = a0, a1, a2, a3
            out_b[r, 0], out_b[r, 1], out_b[r, 2], out_b[r, 3] = b0, b1, b2, b3
            out_c[r, 0], out_c[r, 1], out_c[r, 2], out_c[r, 3] = c0, c1, c2, c3
            if r < n_check:
                x0, x1, x2, x3 = _row_value(c_ptr, c_col, c_code, r, w, tmont, tr2)
                if x0 != c0 or x1 != c1 or x2 != c2 or x3 != c3:
                    if fb < 0:
                        fb = r
                    nb += 1
        first_bad[blk] = fb
        n_bad[blk] = nb


@njit(parallel=True, nogil=True, cache=True)
def _rmatvec(ptr, cols, codes, tmont, x, bounds, out):  # type: ignore[no-untyped-def]
    # out[j] = sum_r M[r, j] x[r] (Montgomery x, v R table: Montgomery out). Task t owns the columns
    # bounds[t] .. bounds[t+1]-1 and scans every entry, as fr.csr_rmatvec does (no transpose, no atomics).
    for t in prange(bounds.shape[0] - 1):
        lo, hi = bounds[t], bounds[t + 1]
        for j in range(lo, hi):
            out[j, 0] = out[j, 1] = out[j, 2] = out[j, 3] = U0
        for r in range(ptr.shape[0] - 1):
            x0, x1, x2, x3 = x[r, 0], x[r, 1], x[r, 2], x[r, 3]
            for k in range(ptr[r], ptr[r + 1]):
                j = np.int64(cols[k])
                if j < lo or j >= hi:
                    continue
                c = codes[k]
                if c == CODE_ONE:
                    p0, p1, p2, p3 = x0, x1, x2, x3
                elif c == CODE_MINUS_ONE:
                    p0, p1, p2, p3 = fsub(U0, U0, U0, U0, x0, x1, x2, x3)
                else:
                    p0, p1, p2, p3 = fmul(tmont[c, 0], tmont[c, 1], tmont[c, 2], tmont[c, 3], x0, x1, x2, x3)
                out[j, 0], out[j, 1], out[j, 2], out[j, 3] = fadd(out[j, 0], out[j, 1], out[j, 2], out[j, 3],
                                                                  p0, p1, p2, p3)


@njit(inline="always")
def _hash(v0, v1, v2, v3):  # type: ignore[no-untyped-def]
    h = v0 * np.uint64(0x9E3779B97F4A7C15)
    h ^= v1 + np.uint64(0xC2B2AE3D27D4EB4F) + (h << np.uint64(6)) + (h >> np.uint64(2))
    h ^= v2 + np.uint64(0x165667B19E3779F9) + (h << np.uint64(6)) + (h >> np.uint64(2))
    h ^= v3 + np.uint64(0x27D4EB2F165667C5) + (h << np.uint64(6)) + (h >> np.uint64(2))
    return h ^ (h >> np.uint64(29))


@njit(inline="always")
def _find(keys, slots, v0, v1, v2, v3):  # type: ignore[no-untyped-def]
    """Slot of value v: the one holding it, or the empty one where it would go."""
    mask = np.uint64(slots.shape[0] - 1)
    i = np.int64(_hash(v0, v1, v2, v3) & mask)
    while True:
        code = slots[i]
        if code < 0:
            return i
        if keys[code, 0] == v0 and keys[code, 1] == v1 and keys[code, 2] == v2 and keys[code, 3] == v3:
            return i
        i = np.int64((np.uint64(i) + np.uint64(1)) & mask)


@njit(cache=True)
def _insert(values, start, keys, slots, n_used):  # type: ignore[no-untyped-def]
    """Add values[start:] until the table is half full; returns (next index, codes used)."""
    cap = keys.shape[0]
    for i in range(start, values.shape[0]):
        v0, v1, v2, v3 = values[i, 0], values[i, 1], values[i, 2], values[i, 3]
        s = _find(keys, slots, v0, v1, v2, v3)
        if slots[s] < 0:
            if n_used == cap:
                return i, n_used
            slots[s] = n_used
            keys[n_used, 0], keys[n_used, 1], keys[n_used, 2], keys[n_used, 3] = v0, v1, v2, v3
            n_used += 1
    return values.shape[0], n_used


@njit(parallel=True, cache=True)
def _lookup(values, keys, slots, remap, out):  # type: ignore[no-untyped-def]
    for i in prange(values.shape[0]):
        s = _find(keys, slots, values[i, 0], values[i, 1], values[i, 2], values[i, 3])
        out[i] = remap[slots[s]]


@njit(cache=True)
def _rehash(keys, n_used, slots):  # type: ignore[no-untyped-def]
    for code in range(n_used):
        s = _find(keys, slots, keys[code, 0], keys[code, 1], keys[code, 2], keys[code, 3])
        slots[s] = code
