"""The witness map on the device: a = A w, b = B w, c = a o b from a standard-form witness.

On the host (:func:`cuzk_mp.algebra.coded_sparse.evaluate_rows_into`) the map of a 2^24 circuit
takes about as long as the device's whole share of the proof, and then a, b and c (3 x 32 B a row)
still cross the bus; on the device it is one pass over the coded rows, and only w is copied. The
circuit's coded A and B rows and their coefficient table (the shared circuit data) go up once per
key and stay while it is resident (:class:`DeviceWitnessMap`), a few bytes per coefficient.

Kernels: ``kernels/witness/witness_map.cu`` (the host version's per-entry paths, so the same bytes):
a thread per row for the short rows, and for the few long ones (:class:`LongRows`: more than
:data:`SHORT_MAX` entries on a side) a thread per segment of such a row, then a thread per row to sum
them, so no warp waits on one thread walking a row of thousands of entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from ...algebra.coded_sparse import CodedMatrix
from ...errors import InputError
from ..base import WitnessRows
from . import memory
from .knobs import WITNESS_MAP_PATH
from .modules import get_module

THREADS = 256  # the kernel's WM_THREADS
# A row whose A or B side has more entries than this is "long": cut into segments of at most this
# many entries of one side (a thread each), then summed by a thread per row (witness_map.cu).
SHORT_MAX = 16
SEG_B = 1 << 31  # the kernel's WM_SEG_B
SCAN_ROWS = 1 << 22  # rows whose lengths the host looks at together when it finds the long ones


@dataclass(frozen=True)
class LongRows:
    """The long rows of a pair of coded matrices (more than ``short_max`` entries on a side) and their
    segments, as the kernels read them: ``rows`` (int64), per row its A segments ``[first[i], mid[i])``
    and B segments ``[mid[i], first[i + 1])``; per segment its first entry ``seg_k`` and its entry
    count ``seg_n`` (| :data:`SEG_B` for B's)."""

    short_max: int
    rows: np.ndarray
    first: np.ndarray
    mid: np.ndarray
    seg_k: np.ndarray
    seg_n: np.ndarray

    @classmethod
    def of(cls, a: CodedMatrix, b: CodedMatrix, short_max: int = SHORT_MAX) -> LongRows:
        n = max(a.n_rows, b.n_rows)
        found = []  # the long rows, a block of rows at a time: the host holds no per-row array of n
        for lo in range(0, n, SCAN_ROWS):
            hi = min(n, lo + SCAN_ROWS)
            long = np.zeros(hi - lo, dtype=bool)
            for m in (a, b):
                if lo < m.n_rows:
                    top = min(hi, m.n_rows)
                    long[: top - lo] |= np.diff(m.indptr[lo : top + 1]) > short_max
            found.append(np.flatnonzero(long) + lo)
        rows = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

        def side(m: CodedMatrix) -> tuple[np.ndarray, np.ndarray]:
            inside = rows < m.n_rows
            r = rows[inside]
            k, length = np.zeros(rows.shape[0], dtype=np.int64), np.zeros(rows.shape[0], dtype=np.int64)
            k[inside] = m.indptr[r]
            length[inside] = m.indptr[r + 1].astype(np.int64) - k[inside]
            return k, length

        (ka, la), (kb, lb) = side(a), side(b)
        sa, sb = -(-la // short_max), -(-lb // short_max)
        first = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(sa + sb, out=first[1:])
        owner = np.repeat(np.arange(rows.shape[0]), sa + sb)
        j = np.arange(int(first[-1]), dtype=np.int64) - first[owner]
        on_b = j >= sa[owner]
        j = np.where(on_b, j - sa[owner], j)
        seg_k = np.where(on_b, kb[owner], ka[owner]) + j * short_max
        seg_n = np.minimum(short_max, np.where(on_b, lb[owner], la[owner]) - j * short_max) | np.where(on_b, SEG_B, 0)
        return cls(int(short_max), rows.astype(np.int64), first.astype(np.uint32), (first[:-1] + sa).astype(np.uint32),
                   seg_k.astype(np.uint32), seg_n.astype(np.uint32))

    @property
    def segments(self) -> int:
        """How many segments the long rows are cut into."""
        return int(self.seg_k.shape[0])

    @property
    def nbytes(self) -> int:
        """Device bytes: the arrays and a 32-byte partial sum per segment."""
        arrays = (self.rows, self.first, self.mid, self.seg_k, self.seg_n)
        return int(sum(x.nbytes for x in arrays) + 32 * self.segments)


def matrices_bytes(a: CodedMatrix, b: CodedMatrix, table_mont: np.ndarray, table_r2: np.ndarray,
                   long: LongRows | None = None) -> int:
    """Device bytes of the coded A and B rows, the coefficient tables and the long rows' segments
    (``long``: :meth:`LongRows.of` the two, unless given)."""
    long = long if long is not None else LongRows.of(a, b)
    return int(a.nbytes + b.nbytes + table_mont.nbytes + table_r2.nbytes + long.nbytes)


class DeviceWitnessMap:
    """A circuit's coded A and B rows and coefficient table on the current device (the caller
    checks the room first: :func:`matrices_bytes`, with the same ``long``). ``long``: the matrices'
    :class:`LongRows` (made here unless given; another threshold than :data:`SHORT_MAX` is for
    benchmarks), ``defines``: the kernel's ``-D`` knobs (benchmarks; the default is the shipped build)."""

    def __init__(self, a: CodedMatrix, b: CodedMatrix, table_mont: np.ndarray, table_r2: np.ndarray,
                 domain_size: int, long: LongRows | None = None, defines: dict[str, int] | None = None) -> None:
        if a.codes.dtype != b.codes.dtype or a.codes.dtype not in (np.uint16, np.uint32):
            raise InputError(f"coded rows: codes must be uint16 or uint32 in both matrices, got {a.codes.dtype} "
                             f"and {b.codes.dtype}")
        if max(a.n_rows, b.n_rows) > domain_size:
            raise InputError(f"coded rows: {max(a.n_rows, b.n_rows)} rows for a domain of {domain_size}")
        self.domain_size = int(domain_size)
        long = long if long is not None else LongRows.of(a, b)
        self.short_max = long.short_max
        self.nbytes = matrices_bytes(a, b, table_mont, table_r2, long)
        self._rows = (a.n_rows, b.n_rows)
        self._long, self._segments = int(long.rows.shape[0]), long.segments
        self._d = [cupy.asarray(np.ascontiguousarray(x)) for x in
                   (a.indptr, a.cols, a.codes, b.indptr, b.cols, b.codes, table_mont, table_r2,
                    long.rows, long.first, long.mid, long.seg_k, long.seg_n)]
        self._d.append(cupy.empty((max(1, long.segments), 4), dtype=np.uint64))  # the segments' partial sums
        mod = get_module(WITNESS_MAP_PATH, defines)
        codes = "u16" if a.codes.dtype == np.uint16 else "u32"
        self._kernels = [mod.get_function(f"witness_map_{codes}"), mod.get_function(f"witness_map_seg_{codes}"),
                         mod.get_function("witness_map_long")]

    @classmethod
    def of_rows(cls, rows: WitnessRows, domain_size: int, long: LongRows | None = None) -> DeviceWitnessMap:
        """The device copy of ``rows`` (the shared circuit data's coded rows) for a key of
        ``domain_size`` rows, once the device is found to have room for it (ResourceError if not);
        ``long``: their :class:`LongRows`, where the caller has them already."""
        long = long if long is not None else LongRows.of(rows.a, rows.b)
        memory.ensure_free(matrices_bytes(rows.a, rows.b, rows.table_mont, rows.table_r2, long),
                           "the witness map's coded rows")
        return cls(rows.a, rows.b, rows.table_mont, rows.table_r2, domain_size, long)

    def run(self, w: Any, a: Any, b: Any, c: Any) -> None:
        """Write a, b, c (device ``(domain_size, 4)`` uint64, Montgomery) from the device witness
        ``w`` (standard form, canonical, every column index of the rows below its length) on the
        current stream."""
        if not self._d:
            raise InputError("the witness map was closed")
        n = self.domain_size
        ap, ac, acode, bp, bc, bcode, tm, tr, rows, first, mid, seg_k, seg_n, partial = self._d
        rows_k, seg_k_fn, long_k = self._kernels
        rows_k((-(-n // THREADS),), (THREADS,), (ap, np.uint64(self._rows[0]), ac, acode, bp, np.uint64(self._rows[1]),
                                                 bc, bcode, tm, tr, w, a, b, c, np.uint64(n),
                                                 np.uint32(self.short_max)))
        if self._long:
            seg_k_fn((-(-self._segments // THREADS),), (THREADS,),
                     (seg_k, seg_n, np.uint64(self._segments), ac, acode, bc, bcode, tm, tr, w, partial))
            long_k((-(-self._long // THREADS),), (THREADS,),
                   (rows, np.uint64(self._long), first, mid, partial, a, b, c))

    def close(self) -> None:
        """Free the device copies (idempotent)."""
        self._d = []
