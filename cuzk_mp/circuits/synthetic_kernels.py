"""The numba kernel of the synthetic circuit's field part: a sponge permutation over all lanes.

Owns :func:`permute_lanes`, the witness side of :meth:`LaneCS.permute
<cuzk_mp.circuits.synthetic_gadgets.LaneCS.permute>`: every round of x^5 S-boxes of every lane in
one parallel call (one call per unit instead of a dozen vector-kernel launches per S-box, whose
thread-pool start-up dominated at small lane counts). Field arithmetic is the inline Montgomery
namespace of :mod:`cuzk_mp.algebra.fr`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from ..algebra import fr
from ..algebra.field import FR, int_to_limbs, ints_to_limbs

fmul = fr.F.mul
fadd = fr.F.add
_STD_ONE = int_to_limbs(1, 4)  # Montgomery-multiplying by standard 1 leaves Montgomery form


@njit(inline="always")
def _mul(a, b):  # type: ignore[no-untyped-def]
    return fmul(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3])


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


@njit(parallel=True, cache=True)
def _permute(state, has_state, p, consts, mds, one, out):  # type: ignore[no-untyped-def]
    n_rounds = consts.shape[0]
    for lane in prange(state.shape[0]):
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
                _put(out, lane, k, _mul(t2, one))
                _put(out, lane, k + 1, _mul(t4, one))
                _put(out, lane, k + 2, _mul(y, one))
                _put(state, lane, i, y)


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


def permute_lanes(state: np.ndarray | None, p: np.ndarray, consts: np.ndarray,
                  mds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the sponge rounds on every lane.

    ``state``: ``(lanes, 3, 4)`` Montgomery (None: no state yet, only ``p`` enters); ``p``:
    ``(lanes, 4)`` Montgomery, absorbed in round 0 with the MDS column 0; ``consts``:
    ``(rounds, 3, 4)`` Montgomery; ``mds``: ``(3, 3)`` small ints (:func:`small_table`). Returns (the new state, the
    standard-form wires ``(lanes, 9 * rounds, 4)``: t2, t4, y of S-box i of round r at
    ``9 r + 3 i + 0, 1, 2``).
    """
    lanes = p.shape[0]
    has_state = state is not None
    new = np.array(state, dtype=np.uint64) if has_state else np.zeros((lanes, 3, 4), dtype=np.uint64)
    out = np.empty((lanes, 9 * consts.shape[0], 4), dtype=np.uint64)
    _permute(new, has_state, np.ascontiguousarray(p), consts, mds, _STD_ONE, out)
    return new, out
