"""From recorded lane templates to the circuit's A, B, C matrices, tiled with numpy.

Owns the compact template form of a recorded circuit piece (per matrix: row pointers, column
offsets, a lane-relative flag and a small coefficient code per entry) and the assembly of the
full CSR matrices from blocks of template instances. Nothing is built entry by entry in Python:
each block is written with a few broadcasting numpy operations straight into the final,
preallocated arrays, so the peak memory is the matrices themselves (no COO triplets, no sort).

Coefficients: the circuit uses only 128 distinct values (1, -1, 2, -2, 2^i, -2^i, SHA-256's K,
the S-box round constants), so entries carry a ``uint16`` code into one :class:`CoefTable` and the
``(nnz, 4) uint64`` data is gathered from it block by block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algebra.field import R_MOD, ints_to_limbs
from ..algebra.sparse import CsrMatrix
from .synthetic_gadgets import LC

MATRICES = ("a", "b", "c")


class CoefTable:
    """Distinct coefficient values of a circuit (standard form), each with a small code."""

    def __init__(self) -> None:
        self._codes: dict[int, int] = {}

    def code(self, coef: int) -> int:
        """The code of ``coef mod r`` (allocating one on first use)."""
        v = coef % R_MOD
        if v not in self._codes:
            self._codes[v] = len(self._codes)
        return self._codes[v]

    def limbs(self) -> np.ndarray:
        """All coefficients as an ``(n_codes, 4) uint64`` standard-form array, indexed by code."""
        return ints_to_limbs(list(self._codes), 4)


@dataclass
class TemplateMatrix:
    """One matrix of a template: entries of row i are ``ptr[i]:ptr[i+1]``.

    Entry k is wire ``col[k] + rel[k] * base`` of the instance whose lane starts at ``base``
    (``rel`` is 1 for lane-relative offsets, 0 for absolute wires).
    """

    ptr: np.ndarray  # (n_rows + 1,) int64
    col: np.ndarray  # (nnz,) uint32
    rel: np.ndarray  # (nnz,) uint32, 0 or 1
    code: np.ndarray  # (nnz,) uint16


@dataclass
class Template:
    """A recorded piece of circuit: ``n_rows`` constraints over ``n_wires`` lane wires."""

    n_rows: int
    n_wires: int
    mats: dict[str, TemplateMatrix]
    wires_upto: np.ndarray  # (n_rows,) int64: lane wires a prefix of i + 1 rows references

    @classmethod
    def from_rows(cls, rows: list[tuple[LC, LC, LC]], n_wires: int, table: CoefTable) -> Template:
        """Compact form of recorded rows (refs >= 0 lane-relative, < 0 absolute wire -1 - ref)."""
        mats = {name: _matrix([row[m] for row in rows], table) for m, name in enumerate(MATRICES)}
        last = np.array([max((r for part in row for r in part if r >= 0), default=-1) for row in rows],
                        dtype=np.int64)
        wires_upto = np.maximum.accumulate(last) + 1 if rows else np.zeros(0, dtype=np.int64)
        return cls(len(rows), n_wires, mats, wires_upto)

    def prefix_wires(self, n_rows: int) -> int:
        """How many lane wires an instance truncated to its first ``n_rows`` rows keeps."""
        return int(self.wires_upto[n_rows - 1]) if n_rows else 0


def _matrix(lcs: list[LC], table: CoefTable) -> TemplateMatrix:
    ptr = np.zeros(len(lcs) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lcs], out=ptr[1:])
    refs = np.array([r for x in lcs for r in x], dtype=np.int64)
    codes = np.array([table.code(c) for x in lcs for c in x.values()], dtype=np.uint16)
    rel = (refs >= 0).astype(np.uint32)
    col = np.where(refs >= 0, refs, -1 - refs).astype(np.uint32)
    return TemplateMatrix(ptr, col, rel, codes)


@dataclass
class Block:
    """Instances of one template: one per entry of ``bases`` (uint32 lane base wires), each
    truncated to its first ``n_rows`` rows (``n_rows = template.n_rows`` for whole lanes)."""

    template: Template
    bases: np.ndarray
    n_rows: int

    def rows(self) -> int:
        """Rows this block contributes."""
        return len(self.bases) * self.n_rows

    def nnz(self, m: str) -> int:
        """Entries this block contributes to matrix ``m``."""
        return len(self.bases) * int(self.template.mats[m].ptr[self.n_rows])


def assemble(blocks: list[Block], table: CoefTable, n_wires: int) -> dict[str, CsrMatrix]:
    """The A, B, C matrices of the blocks stacked in order (rows = constraints, cols = wires)."""
    values = table.limbs()
    n_rows = sum(b.rows() for b in blocks)
    out = {}
    for m in MATRICES:
        nnz = sum(b.nnz(m) for b in blocks)
        indptr = np.empty(n_rows + 1, dtype=np.int64)
        indptr[0] = 0
        indices = np.empty(nnz, dtype=np.uint32)
        data = np.empty((nnz, 4), dtype=np.uint64)
        row0 = k0 = 0
        for b in blocks:
            _fill(b, b.template.mats[m], values, indptr[row0 + 1 : row0 + 1 + b.rows()],
                  indices[k0 : k0 + b.nnz(m)], data[k0 : k0 + b.nnz(m)], k0)
            row0, k0 = row0 + b.rows(), k0 + b.nnz(m)
        out[m] = CsrMatrix(indptr, indices, data, n_wires)
    return out


def _fill(b: Block, tm: TemplateMatrix, values: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
          data: np.ndarray, k0: int) -> None:
    """Write one block's rows: row pointers, wire indices and coefficients, all by broadcasting."""
    n_inst, n_rows = len(b.bases), b.n_rows
    per = int(tm.ptr[n_rows])  # entries per instance
    starts = k0 + np.arange(n_inst, dtype=np.int64) * per
    np.add(starts[:, None], tm.ptr[None, 1 : n_rows + 1], out=indptr.reshape(n_inst, n_rows))
    if per == 0:
        return
    ix = indices.reshape(n_inst, per)
    np.multiply(b.bases.astype(np.uint32)[:, None], tm.rel[None, :per], out=ix)
    ix += tm.col[None, :per]
    data.reshape(n_inst, per * 4)[:] = values[tm.code[:per]].reshape(1, per * 4)  # rows of whole instances: long copies
