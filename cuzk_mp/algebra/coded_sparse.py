"""Sparse Fr matrices whose coefficients are small codes into a table of distinct values.

A constraint system has tens of millions of coefficients but few distinct ones (most are 1 or
-1, the rest small integers or a handful of constants), so a :class:`CodedMatrix` stores per
entry a uint32 column and a uint16 (or uint32) code instead of a 32-byte Montgomery word: 6 bytes
an entry instead of 36. Codes :data:`~.row_codes.CODE_ONE` and :data:`~.row_codes.CODE_MINUS_ONE` are reserved for
+1 and -1; the table holds every value twice, as v R (Montgomery form) and v R^2.

:func:`evaluate_rows_into` is the witness map over such matrices: a = A w, b = B w (Montgomery
form, what snarkjs's ``buildABC`` gives for v R^2 coefficients and a standard witness),
c = a o b, and the check c == C w for the first rows, all in one pass over row blocks in
parallel (numba ``prange``, in :mod:`.coded_sparse_kernels`, imported at the first call: the
matrices themselves need no numba), written straight into the caller's arrays. C w is never
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
from types import ModuleType

import numpy as np

from . import fr

ROW_BLOCK = 4096  # rows per parallel work item of the witness map


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


def _k() -> ModuleType:
    """The kernels module (numba is imported with it, at the first call that needs a loop)."""
    from . import coded_sparse_kernels

    return coded_sparse_kernels


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
    _k()._evaluate(ma.indptr, ma.cols, ma.codes, mb.indptr, mb.cols, mb.codes, mc.indptr, mc.cols, mc.codes,
              _readonly(tmont), _readonly(tr2), _readonly(np.ascontiguousarray(w)), out_a, out_b, out_c, block,
              first_bad, n_bad)
    bad = first_bad[first_bad >= 0]
    return (int(bad[0]) if bad.size else -1), int(n_bad.sum())


# ------------------------------------------------------------------ transposed product


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
    _k()._rmatvec(mat.indptr, mat.cols, mat.codes, _readonly(tmont), _readonly(np.ascontiguousarray(x)),
             fr.column_bounds(m.cols, n_cols, tasks), out)
    return fr.from_mont_into(out, out)


# ------------------------------------------------------------------ distinct values


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
            i, self.count = _k()._insert(values, i, self.keys, self.slots, self.count)
            if i == values.shape[0]:
                return
            self._grow()

    def _grow(self) -> None:
        keys = np.zeros((2 * self.keys.shape[0], 4), dtype=np.uint64)
        keys[: self.count] = self.keys[: self.count]
        self.keys, self.slots = keys, np.full(2 * keys.shape[0], -1, dtype=np.int64)
        _k()._rehash(self.keys, self.count, self.slots)

    @property
    def values(self) -> np.ndarray:
        """The distinct rows, ``(count, 4)``, in order of first appearance."""
        return self.keys[: self.count]

    def lookup_into(self, values: np.ndarray, remap: np.ndarray, out: np.ndarray) -> None:
        """out[i] = remap[number of values[i]] (every row must have been added)."""
        _k()._lookup(values, self.keys, self.slots, remap, out)
