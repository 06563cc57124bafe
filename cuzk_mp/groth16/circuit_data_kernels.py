"""numba kernel of the circuit-data cache's build: the A/B counting sort into coded rows.

:func:`scatter_rows` sorts the zkey's coefficient entries into the A and B rows (stable within
a row, like :func:`cuzk_mp.formats.zkey_kernels.fill_rows`) writing a column and a code per entry
instead of 32 bytes. Imported by a build only: opening a cache needs no numba.
"""

from __future__ import annotations

import numpy as np

from ..algebra.jit import njit


@njit(cache=True)
def scatter_rows(m, c, s, codes, ptr_a, ptr_b, cols_a, cols_b, codes_a, codes_b):  # type: ignore[no-untyped-def]
    """Entry i (matrix m[i], row c[i], column s[i], code codes[i]) goes to the next free place of its row.

    ``ptr_a``/``ptr_b`` are the row pointers from the entries' row counts (every entry's row is
    below their length - 1).
    """
    nxt_a = ptr_a[:-1].astype(np.int64)
    nxt_b = ptr_b[:-1].astype(np.int64)
    for i in range(m.shape[0]):
        row = c[i]
        if m[i] == 0:
            p = nxt_a[row]
            nxt_a[row] = p + 1
            cols_a[p] = s[i]
            codes_a[p] = codes[i]
        else:
            p = nxt_b[row]
            nxt_b[row] = p + 1
            cols_b[p] = s[i]
            codes_b[p] = codes[i]
