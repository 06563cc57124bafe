"""The numba kernels of the PoRep-shaped circuit's witness: the sponge over all lanes, and the wire writer.

Owns :func:`permute_lanes`, the witness side of :meth:`LaneCS.permute
<cuzk_mp.circuits.synthetic_gadgets.LaneCS.permute>`: every round of x^5 S-boxes of every lane in
one parallel call (one call per unit instead of a dozen vector-kernel launches per S-box, whose
thread-pool start-up dominated at small lane counts), writing each lane's wires straight into the
witness; and :func:`write_lane_wires`, the lane-parallel writer of the bit words. Field arithmetic
is the inline Montgomery namespace of :mod:`cuzk_mp.algebra.fr`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..algebra import fr_kernels
from ..algebra.field import FR, ints_to_limbs
from ..algebra.jit import njit, prange

fmul = fr_kernels.F.mul
fadd = fr_kernels.F.add
fredc = fr_kernels.F.redc


@njit(inline="always")
def _mul(a, b):  # type: ignore[no-untyped-def]
    return fmul(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3])


@njit(inline="always")
def _std(a):  # type: ignore[no-untyped-def]
    return fredc(a[0], a[1], a[2], a[3])


@njit(inline="always")
def _add(a, b):  # type: ignore[no-untyped-def]
    return fadd(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3])


@njit(inline="always")
def _get(arr, i, j):  # type: ignore[no-untyped-def]
    return arr[i, j, 0], arr[i, j, 1], arr[i, j, 2], arr[i, j, 3]


@njit(inline="always")
def _put(arr, i, j, v):  # type: ignore[no-untyped-def]
    arr[i, j, 0], arr[i, j, 1], arr[i, j, 2], arr[i, j, 3] = v[0], v[1], v[2], v[3]


@njit(inline="always")
def _times(k, v):  # type: ignore[no-untyped-def]
    """k * v for a small positive int k, by repeated addition (MDS entries are 1 or 2)."""
    acc = v
    for _ in range(k - 1):
        acc = _add(acc, v)
    return acc


@njit(inline="always")
def _linear(state, lane, i, r, has_state, p, consts, mds):  # type: ignore[no-untyped-def]
    """x_i = sum_j mds[i][j] y_j (if there is a state) + mds[i][0] p (round 0) + c[r][i]."""
    acc = _get(consts, r, i)
    if r > 0 or has_state:
        for j in range(3):
            acc = _add(acc, _times(mds[i, j], _get(state, lane, j)))
    if r == 0:
        acc = _add(acc, _times(mds[i, 0], (p[lane, 0], p[lane, 1], p[lane, 2], p[lane, 3])))
    return acc


@njit(parallel=True, nogil=True, cache=True)
def _permute(state, has_state, p, consts, mds, out, base, width, n_full, keep_partial):  # type: ignore[no-untyped-def]
    n_rounds = consts.shape[0]
    for lane in prange(state.shape[0]):
        start = base + lane * width
        keep = 9 * n_rounds if lane < n_full else min(9 * n_rounds, keep_partial)
        for r in range(n_rounds):
            x0 = _linear(state, lane, 0, r, has_state, p, consts, mds)
            x1 = _linear(state, lane, 1, r, has_state, p, consts, mds)
            x2 = _linear(state, lane, 2, r, has_state, p, consts, mds)
            for i in range(3):
                x = x0 if i == 0 else (x1 if i == 1 else x2)
                t2 = _mul(x, x)
                t4 = _mul(t2, t2)
                y = _mul(t4, x)
                k = 9 * r + 3 * i
                if k < keep:
                    _put_row(out, start + k, _std(t2))
                if k + 1 < keep:
                    _put_row(out, start + k + 1, _std(t4))
                if k + 2 < keep:
                    _put_row(out, start + k + 2, _std(y))
                _put(state, lane, i, y)


@njit(inline="always")
def _put_row(out, row, v):  # type: ignore[no-untyped-def]
    out[row, 0], out[row, 1], out[row, 2], out[row, 3] = v[0], v[1], v[2], v[3]


@njit(parallel=True, nogil=True, cache=True)
def write_lane_wires(out, base, width, n_full, partial_width, offs, nbits, vals, f_offs, f_vals):  # type: ignore[no-untyped-def]
    """Lane-parallel write of collected wires: bit word j of lane l (``vals[j, l]``, ``nbits[j]``
    bits) to wires ``offs[j]..`` of the lane, field wire j (``f_vals[j, l]``, standard form) to
    wire ``f_offs[j]``; lane ``n_full`` (the truncated one) keeps its first ``partial_width`` wires.
    """
    lanes = vals.shape[1] if vals.shape[0] else f_vals.shape[1]
    for lane in prange(lanes):
        start = base + lane * width
        keep = width if lane < n_full else partial_width
        for j in range(offs.shape[0]):
            v = vals[j, lane]
            off = offs[j]
            for bit in range(min(nbits[j], keep - off)):
                row = start + off + bit
                out[row, 0] = (v >> np.uint64(bit)) & np.uint64(1)
                out[row, 1] = 0
                out[row, 2] = 0
                out[row, 3] = 0
        for j in range(f_offs.shape[0]):
            if f_offs[j] < keep:
                _put_row(out, start + f_offs[j], f_vals[j, lane])


def small_table(values: Sequence[Sequence[int]]) -> np.ndarray:
    """An MDS table as ``int64``; entries must be small positive ints (applied by repeated addition)."""
    arr = np.array(values, dtype=np.int64)
    if arr.shape != (3, 3) or arr.min() < 1 or arr.max() > 8:
        raise ValueError(f"sponge MDS must be a 3x3 table of ints in [1, 8], got {values}")
    return arr


def mont_table(values: Sequence[Sequence[int]]) -> np.ndarray:
    """A ``(rows, cols, 4)`` Montgomery-form array of a table of Python ints."""
    flat = [FR.to_mont_int(v % FR.modulus) for row in values for v in row]
    return ints_to_limbs(flat, 4).reshape(len(values), len(values[0]), 4)


def permute_lanes(state: np.ndarray | None, p: np.ndarray, consts: np.ndarray, mds: np.ndarray,
                  write: tuple[np.ndarray, int, int, int, int] | None = None) -> np.ndarray:
    """Run the sponge rounds on every lane; returns the new state.

    ``state``: ``(lanes, 3, 4)`` Montgomery (None: no state yet, only ``p`` enters); ``p``:
    ``(lanes, 4)`` Montgomery, absorbed in round 0 with the MDS column 0; ``consts``:
    ``(rounds, 3, 4)`` Montgomery; ``mds``: ``(3, 3)`` small ints (:func:`small_table`).
    With ``write`` = (out, base, width, whole lanes, wires the truncated lane keeps) the round
    wires go to ``out`` in standard form, lane l's from row ``base + l * width``: t2, t4, y of
    S-box i of round r at ``9 r + 3 i + 0, 1, 2`` (lane-parallel, each lane's block contiguous).
    """
    lanes = p.shape[0]
    has_state = state is not None
    new = np.array(state, dtype=np.uint64) if has_state else np.zeros((lanes, 3, 4), dtype=np.uint64)
    out, base, width, n_full, keep = write if write is not None else (np.zeros((0, 4), np.uint64), 0, 0, 0, 0)
    _permute(new, has_state, np.ascontiguousarray(p), consts, mds, out, base, width, n_full, keep)
    return new
