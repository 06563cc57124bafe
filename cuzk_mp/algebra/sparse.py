"""Sparse matrices over Fr in CSR form, and their product with a witness.

The R1CS matrices (A, B, C) and the zkey coefficient section are both turned
into :class:`CsrMatrix`; one row per constraint, one column per wire. Which
form the coefficients are in (standard, or snarkjs's v R^2) decides the form of
the product: R^2-scaled coefficients times a standard-form witness give a
Montgomery-form result (snarkjs ``buildABC``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import fr

@dataclass
class CsrMatrix:
    """rows x cols sparse Fr matrix: row r has entries ``indices[indptr[r]:indptr[r+1]]``."""

    indptr: np.ndarray  # (n_rows + 1,) int64
    indices: np.ndarray  # (nnz,) uint32 column (wire) ids
    data: np.ndarray  # (nnz, 4) uint64 coefficients
    n_cols: int

    @property
    def n_rows(self) -> int:
        """Number of rows (constraints)."""
        return int(self.indptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.indices.shape[0])

    @property
    def nbytes(self) -> int:
        """Host bytes held by the three arrays."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.data.nbytes)

    def matvec(self, w: np.ndarray) -> np.ndarray:
        """This matrix times ``w`` (an ``(n_cols, 4)`` Fr array), one row per output."""
        if w.shape[0] < self.n_cols:
            raise ValueError(f"vector has {w.shape[0]} entries, matrix has {self.n_cols} columns")
        return fr.csr_matvec(self.indptr, self.indices, self.data, w)

    def rmatvec(self, w: np.ndarray) -> np.ndarray:
        """The transpose of this matrix times ``w`` (one entry per row): one output row per column."""
        return fr.csr_rmatvec(self.indptr, self.indices, self.data, w, self.n_cols)

    def with_rows(self, n_rows: int) -> CsrMatrix:
        """The same matrix padded with empty rows (or truncated) to ``n_rows`` rows."""
        if n_rows >= self.n_rows:
            pad = np.full(n_rows - self.n_rows, self.indptr[-1], dtype=np.int64)
            return CsrMatrix(np.concatenate([self.indptr, pad]), self.indices, self.data, self.n_cols)
        end = int(self.indptr[n_rows])
        return CsrMatrix(self.indptr[: n_rows + 1].copy(), self.indices[:end], self.data[:end], self.n_cols)

    def to_r2_form(self) -> CsrMatrix:
        """Standard-form coefficients -> v R^2 form (so products with a standard witness are Montgomery)."""
        scaled = fr.to_mont(fr.to_mont(np.ascontiguousarray(self.data)))
        return CsrMatrix(self.indptr, self.indices, scaled, self.n_cols)

def from_coo(rows: np.ndarray, cols: np.ndarray, data: np.ndarray, n_rows: int, n_cols: int) -> CsrMatrix:
    """Build a CSR matrix from COO triplets (rows need not be sorted; order within a row is kept)."""
    rows = np.asarray(rows, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    counts = np.bincount(rows, minlength=n_rows)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return CsrMatrix(
        indptr,
        np.ascontiguousarray(np.asarray(cols, dtype=np.uint32)[order]),
        np.ascontiguousarray(np.asarray(data, dtype=np.uint64)[order]),
        n_cols,
    )
