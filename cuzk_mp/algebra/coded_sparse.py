"""Sparse Fr matrices whose coefficients are small codes into a table of distinct values.

A constraint system has tens of millions of coefficients but few distinct ones (most are 1 or
-1, the rest small integers or a handful of constants), so a :class:`CodedMatrix` stores per
entry a uint32 column and a uint16 (or uint32) code instead of a 32-byte Montgomery word: 6 bytes
an entry instead of 36. Codes :data:`CODE_ONE` and :data:`CODE_MINUS_ONE` are reserved for
+1 and -1; the table holds every value twice, as v R (Montgomery form) and v R^2.

:func:`evaluate_rows_into` is the witness map over such matrices: a = A w, b = B w (Montgomery
form, what snarkjs's ``buildABC`` gives for v R^2 coefficients and a standard witness),
c = a o b, and the check c == C w for the first rows, all in one pass over row blocks in
parallel (numba ``prange``), written straight into the caller's arrays. C w is never
materialised: each row's value is compared where it is computed. Per entry it takes the
cheapest exact path:

* witness value 0: skipped; witness value 1: the table's v R is added (no multiply);
* coefficient +-1 and any other witness value: w is added to (subtracted from) a
  standard-form accumulator, turned into Montgomery form by one multiply per row;
* otherwise one Montgomery multiply of v R^2 by w.

Every row is computed by one thread, in entry order, so the bytes are the same for any
thread count. :class:`DistinctValues` is the hash set that assigns the codes when the
matrices are built (numba, open addressing; grown by doubling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from . import fr
from .field import FR, int_to_limbs

fmul = fr.F.mul
fadd = fr.F.add
fsub = fr.F.sub
U0 = np.uint64(0)
R2_LIMBS = int_to_limbs(FR.r2, 4)
CODE_ONE = 0
CODE_MINUS_ONE = 1
ROW_BLOCK = 4096  # rows per parallel work item of the witness map
_EMPTY = np.int64(-1)


@dataclass
class CodedMatrix:
    """rows x cols sparse matrix: row r has columns ``cols[indptr[r]:indptr[r+1]]`` and codes ``codes[...]``.

    ``indptr`` and ``cols`` are uint32 (fewer than 2^32 entries), ``codes`` uint16 (uint32 past
    65536 distinct values). Rows past ``n_rows`` are empty.
    """

    indptr: np.ndarray
    cols: np.ndarray
    codes: np.ndarray

    @property
    def n_rows(self) -> int:
        """Rows stored (later rows are empty)."""
        return int(self.indptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        """Stored entries."""
        return int(self.cols.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the three arrays."""
        return int(self.indptr.nbytes + self.cols.nbytes + self.codes.nbytes)


def code_dtype(n_codes: int) -> np.dtype:
    """uint16 codes, uint32 past 65536 distinct values (uint8 would save 1 byte an entry for
    small tables, at the price of a third compiled variant of the kernel)."""
    for dt in (np.uint16, np.uint32):
        if n_codes <= np.iinfo(dt).max + 1:
            return np.dtype(dt)
    raise ValueError(f"{n_codes} distinct coefficients do not fit 32-bit codes")


MAX_ENTRIES = (1 << 32) - 1  # row pointers are uint32


# ------------------------------------------------------------------ evaluation


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


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def readonly_matrix(m: CodedMatrix) -> CodedMatrix:
    """The same matrix over read-only views (what a mapped cache gives; one kernel signature for both)."""
    return CodedMatrix(_readonly(m.indptr), _readonly(m.cols), _readonly(m.codes))


def evaluate_rows_into(a: CodedMatrix, b: CodedMatrix, c: CodedMatrix | None, tmont: np.ndarray, tr2: np.ndarray,
                       w: np.ndarray, out_a: np.ndarray, out_b: np.ndarray, out_c: np.ndarray,
                       block: int = ROW_BLOCK) -> tuple[int, int]:
    """out_a = A w, out_b = B w, out_c = out_a o out_b over all rows of the outputs; with ``c``,
    compare out_c with C w on C's rows. Returns (first failing row or -1, failing rows).

    ``w`` must be canonical standard-form values (``(n, 4) uint64``, every column index of the
    matrices < n); the outputs C-contiguous ``(rows, 4) uint64`` (Montgomery form). Every
    matrix has uint32 row pointers and the same code dtype. Runs on numba's current thread
    count; the result does not depend on it.
    """
    if c is None:
        c = CodedMatrix(np.zeros(1, np.uint32), np.zeros(0, np.uint32), np.zeros(0, a.codes.dtype))
    if c.n_rows > out_a.shape[0]:
        raise ValueError(f"C has {c.n_rows} rows, the outputs {out_a.shape[0]}")
    mats = [readonly_matrix(m) for m in (a, b, c)]
    nblocks = -(-out_a.shape[0] // block)
    first_bad = np.empty(nblocks, dtype=np.int64)
    n_bad = np.empty(nblocks, dtype=np.int64)
    ma, mb, mc = mats
    _evaluate(ma.indptr, ma.cols, ma.codes, mb.indptr, mb.cols, mb.codes, mc.indptr, mc.cols, mc.codes,
              _readonly(tmont), _readonly(tr2), _readonly(np.ascontiguousarray(w)), out_a, out_b, out_c, block,
              first_bad, n_bad)
    bad = first_bad[first_bad >= 0]
    return (int(bad[0]) if bad.size else -1), int(n_bad.sum())


# ------------------------------------------------------------------ transposed product


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


def rmatvec(m: CodedMatrix, tmont: np.ndarray, x: np.ndarray, n_cols: int, tasks: int | None = None) -> np.ndarray:
    """The transposed product ``out[j] = sum_r M[r, j] x[r]`` in standard form, ``(n_cols, 4)``.

    ``x`` is in Montgomery form (at least M's row count of entries) and ``tmont`` the table as v R;
    a coefficient +-1 costs an addition, any other one Montgomery multiply. Parallel over column
    ranges of about equal entry counts (:func:`cuzk_mp.algebra.fr.column_bounds`); the result does
    not depend on the thread count. This is what a setup needs of the circuit (the QAP columns at
    tau: x = the Lagrange values) when it has only the compact matrices.
    """
    if x.shape[0] < m.n_rows:
        raise ValueError(f"vector has {x.shape[0]} entries, matrix has {m.n_rows} rows")
    out = np.empty((n_cols, 4), dtype=np.uint64)
    mat = readonly_matrix(m)
    _rmatvec(mat.indptr, mat.cols, mat.codes, _readonly(tmont), _readonly(np.ascontiguousarray(x)),
             fr.column_bounds(m.cols, n_cols, tasks), out)
    return fr.from_mont_into(out, out)


# ------------------------------------------------------------------ distinct values


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


class DistinctValues:
    """The distinct rows of ``(n, 4) uint64`` arrays, numbered in order of first appearance."""

    def __init__(self, capacity: int = 1 << 10) -> None:
        self.keys = np.zeros((capacity, 4), dtype=np.uint64)
        self.slots = np.full(2 * capacity, -1, dtype=np.int64)  # never more than half full
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        """Number every row of ``values`` not seen before."""
        i = 0
        while True:
            i, self.count = _insert(values, i, self.keys, self.slots, self.count)
            if i == values.shape[0]:
                return
            self._grow()

    def _grow(self) -> None:
        keys = np.zeros((2 * self.keys.shape[0], 4), dtype=np.uint64)
        keys[: self.count] = self.keys[: self.count]
        self.keys, self.slots = keys, np.full(2 * keys.shape[0], -1, dtype=np.int64)
        _rehash(self.keys, self.count, self.slots)

    @property
    def values(self) -> np.ndarray:
        """The distinct rows, ``(count, 4)``, in order of first appearance."""
        return self.keys[: self.count]

    def lookup_into(self, values: np.ndarray, remap: np.ndarray, out: np.ndarray) -> None:
        """out[i] = remap[number of values[i]] (every row must have been added)."""
        _lookup(values, self.keys, self.slots, remap, out)
