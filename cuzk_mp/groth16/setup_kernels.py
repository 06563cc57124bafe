"""numba kernel of the development setup: the coefficient section (zkey section 4) from the R1CS.

The section holds every A and B entry of the circuit, 44 bytes each (about 23 GB at 2^27), in
snarkjs order: per constraint its A entries then its B entries, in r1cs order. Where each
constraint's entries go is known from the two CSR row pointers (row c starts at
``a.indptr[c] + b.indptr[c]``), so :func:`fill_coefs` writes any range of constraints straight
into a structured array's fields, in parallel over rows, converting the value to v R^2 on the way
with one Montgomery product (numpy made a dozen single-threaded passes with temporaries).
"""

from __future__ import annotations

from ..algebra.fr_kernels import fmul
from ..algebra.jit import njit, prange


@njit(inline="always", cache=True)
def _put(m, c, k, d, idx, data, r3, matrix, constraint, signal, value):  # type: ignore[no-untyped-def]
    matrix[d] = m
    constraint[d] = c
    signal[d] = idx[k]
    value[d, 0], value[d, 1], value[d, 2], value[d, 3] = fmul(data[k, 0], data[k, 1], data[k, 2], data[k, 3],
                                                              r3[0], r3[1], r3[2], r3[3])  # v R^3 / R


@njit(parallel=True, cache=True)
def fill_coefs(a_indptr, a_idx, a_data, b_indptr, b_idx, b_data, lo, hi, r3,  # type: ignore[no-untyped-def]
               matrix, constraint, signal, value):
    """Constraints lo .. hi-1 into the fields of a coefficient array whose entry 0 is constraint lo's first.

    ``r3`` is R^3 mod r as limbs: one Montgomery product with it takes a standard v to v R^2.
    """
    base = a_indptr[lo] + b_indptr[lo]
    for c in prange(lo, hi):
        d = a_indptr[c] + b_indptr[c] - base
        for k in range(a_indptr[c], a_indptr[c + 1]):
            _put(0, c, k, d, a_idx, a_data, r3, matrix, constraint, signal, value)
            d += 1
        for k in range(b_indptr[c], b_indptr[c + 1]):
            _put(1, c, k, d, b_idx, b_data, r3, matrix, constraint, signal, value)
            d += 1
