"""numba kernels over a zkey's coefficient section (section 4): validation and CSR building.

A 2^24 key holds tens of millions of 44-byte entries. :func:`check_coefs`
reads each entry once, in parallel blocks, and reports the first bad one
(numpy would make several full passes with temporaries); :func:`count_rows`
and :func:`fill_rows` are a stable counting sort of the entries into the A
and B CSR matrices. The kernels take the structured array's fields as strided
views, so nothing is copied out first.
"""

from __future__ import annotations

import numpy as np

from ..algebra.jit import njit, prange

BAD_MATRIX = 1
BAD_CONSTRAINT = 2
BAD_SIGNAL = 3
BAD_VALUE = 4
_BLOCK = 1 << 16


@njit(inline="always", cache=True)
def _entry_error(m, c, s, v, i, domain_size, n_vars, r):  # type: ignore[no-untyped-def]
    if m[i] > 1:
        return BAD_MATRIX
    if c[i] >= domain_size:
        return BAD_CONSTRAINT
    if s[i] >= n_vars:
        return BAD_SIGNAL
    for j in range(3, -1, -1):
        if v[i, j] != r[j]:
            return 0 if v[i, j] < r[j] else BAD_VALUE
    return BAD_VALUE  # equal to r


@njit(parallel=True, cache=True)
def check_coefs(m, c, s, v, domain_size, n_vars, r):  # type: ignore[no-untyped-def]
    """Status (code, index) of the first entry with matrix > 1, constraint >= domain_size,
    signal >= n_vars or value >= r; code 0 when all entries are valid.

    ``m, c, s`` are the u32 fields and ``v`` the ``(n, 4)`` u64 field of a
    COEF_DTYPE array (strided views are fine).
    """
    n = m.shape[0]
    nblocks = (n + _BLOCK - 1) // _BLOCK
    first = np.full(nblocks, -1, dtype=np.int64)
    codes = np.zeros(nblocks, dtype=np.int64)
    for b in prange(nblocks):
        for i in range(b * _BLOCK, min(n, (b + 1) * _BLOCK)):
            e = _entry_error(m, c, s, v, i, domain_size, n_vars, r)
            if e != 0:
                first[b] = i
                codes[b] = e
                break
    status = np.zeros(2, dtype=np.int64)
    for b in range(nblocks):
        if first[b] >= 0:
            status[0], status[1] = codes[b], first[b]
            break
    return status


@njit(cache=True)
def count_rows(m, c, n_rows, counts):  # type: ignore[no-untyped-def]
    """counts[matrix, row] += 1 for every entry; returns the index of the first entry with
    matrix > 1 or constraint >= n_rows (it is not counted), or -1."""
    for i in range(m.shape[0]):
        if m[i] > 1 or c[i] >= n_rows:
            return i
        counts[m[i], c[i]] += 1
    return -1


@njit(cache=True)
def fill_rows(m, c, s, v, indptr, idx_a, idx_b, data_a, data_b):  # type: ignore[no-untyped-def]
    """Counting-sort fill of the A (matrix 0) and B (matrix 1) CSR arrays, stable within a row.

    ``indptr`` is ``(2, n_rows + 1)`` from :func:`count_rows`'s counts; entries
    must have passed :func:`count_rows`.
    """
    nxt = indptr[:, :-1].copy()
    for i in range(m.shape[0]):
        row = c[i]
        if m[i] == 0:
            p = nxt[0, row]
            nxt[0, row] += 1
            idx_a[p] = s[i]
            for j in range(4):
                data_a[p, j] = v[i, j]
        else:
            p = nxt[1, row]
            nxt[1, row] += 1
            idx_b[p] = s[i]
            for j in range(4):
                data_b[p, j] = v[i, j]
