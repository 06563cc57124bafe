"""The witness map on the device: a = A w, b = B w, c = a o b from a standard-form witness.

On the host (:func:`cuzk_mp.algebra.coded_sparse.evaluate_rows_into`) the map of a 2^24 circuit
takes about as long as the device's whole share of the proof, and then a, b and c (3 x 32 B a row)
still cross the bus; on the device it is one pass over the coded rows, and only w is copied. The
circuit's coded A and B rows and their coefficient table (the shared circuit data) go up once per
key and stay while it is resident (:class:`DeviceWitnessMap`), a few bytes per coefficient.

Kernel: ``kernels/witness/witness_map.cu`` (the host version's per-entry paths, so the same bytes).
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from ...algebra.coded_sparse import CodedMatrix
from ...errors import InputError
from .knobs import WITNESS_MAP_PATH
from .modules import get_module

THREADS = 256  # the kernel's WM_THREADS


def matrices_bytes(a: CodedMatrix, b: CodedMatrix, table_mont: np.ndarray, table_r2: np.ndarray) -> int:
    """Device bytes of the coded A and B rows and the coefficient tables."""
    return int(a.nbytes + b.nbytes + table_mont.nbytes + table_r2.nbytes)


class DeviceWitnessMap:
    """A circuit's coded A and B rows and coefficient table on the current device (the caller
    checks the room first: :func:`matrices_bytes`)."""

    def __init__(self, a: CodedMatrix, b: CodedMatrix, table_mont: np.ndarray, table_r2: np.ndarray,
                 domain_size: int) -> None:
        if a.codes.dtype != b.codes.dtype or a.codes.dtype not in (np.uint16, np.uint32):
            raise InputError(f"coded rows: codes must be uint16 or uint32 in both matrices, got {a.codes.dtype} "
                             f"and {b.codes.dtype}")
        if max(a.n_rows, b.n_rows) > domain_size:
            raise InputError(f"coded rows: {max(a.n_rows, b.n_rows)} rows for a domain of {domain_size}")
        self.domain_size = int(domain_size)
        self.nbytes = matrices_bytes(a, b, table_mont, table_r2)
        self._rows = (a.n_rows, b.n_rows)
        self._d = [cupy.asarray(np.ascontiguousarray(x)) for x in
                   (a.indptr, a.cols, a.codes, b.indptr, b.cols, b.codes, table_mont, table_r2)]
        name = "witness_map_u16" if a.codes.dtype == np.uint16 else "witness_map_u32"
        self._kernel = get_module(WITNESS_MAP_PATH).get_function(name)

    def run(self, w: Any, a: Any, b: Any, c: Any) -> None:
        """Write a, b, c (device ``(domain_size, 4)`` uint64, Montgomery) from the device witness
        ``w`` (standard form, canonical, every column index of the rows below its length) on the
        current stream."""
        if not self._d:
            raise InputError("the witness map was closed")
        n = self.domain_size
        ap, ac, acode, bp, bc, bcode, tm, tr = self._d
        args = (ap, np.uint64(self._rows[0]), ac, acode, bp, np.uint64(self._rows[1]), bc, bcode, tm, tr, w, a, b, c,
                np.uint64(n))
        self._kernel((-(-n // THREADS),), (THREADS,), args)

    def close(self) -> None:
        """Free the device copies (idempotent)."""
        self._d = []
