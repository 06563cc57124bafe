"""Point conversions between the layouts cuzk-mp meets.

* zkey layout: G1 ``(12,) uint64`` (x, y; Montgomery Fq limbs), G2 ``(24,)``
  (x.c0, x.c1, y.c0, y.c1); all zeros is the point at infinity.
* "affine ints": G1 ``(x, y)`` / G2 ``((x0, x1), (y0, y1))`` standard-form
  Python ints, ``None`` for infinity (what snarkjs JSON holds).
* py_arkworks_bls12381 ``G1Point`` / ``G2Point`` objects, built from standard
  little-endian ``x || y`` bytes (96 zero bytes = infinity).

Bulk conversions (whole zkey sections) go through the numba Fq kernels; the
single-point ones use Python ints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional, TypeVar

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from . import fq
from .field import FQ, FQ_BYTES, R_MOD, int_to_limbs, limbs_to_ints

G1Affine = Optional[tuple[int, int]]
G2Affine = Optional[tuple[tuple[int, int], tuple[int, int]]]
PointT = TypeVar("PointT", G1Point, G2Point)


def _coords_from_lem(row: np.ndarray) -> list[int]:
    vals = limbs_to_ints(np.asarray(row, dtype=np.uint64).reshape(-1, 6))
    return [FQ.from_mont_int(v) for v in vals]


def g1_from_lem(row: np.ndarray) -> G1Affine:
    """zkey-layout G1 row -> affine ints (None for the all-zero infinity)."""
    if not np.any(row):
        return None
    x, y = _coords_from_lem(row)
    return (x, y)


def g2_from_lem(row: np.ndarray) -> G2Affine:
    """zkey-layout G2 row -> affine ints."""
    if not np.any(row):
        return None
    x0, x1, y0, y1 = _coords_from_lem(row)
    return ((x0, x1), (y0, y1))


def _lem_from_coords(coords: list[int]) -> np.ndarray:
    return np.concatenate([int_to_limbs(FQ.to_mont_int(c), 6) for c in coords])


def g1_to_lem(p: G1Affine) -> np.ndarray:
    """Affine ints -> zkey-layout ``(12,)`` row."""
    return np.zeros(12, dtype=np.uint64) if p is None else _lem_from_coords([p[0], p[1]])


def g2_to_lem(p: G2Affine) -> np.ndarray:
    """Affine ints -> zkey-layout ``(24,)`` row."""
    return np.zeros(24, dtype=np.uint64) if p is None else _lem_from_coords([p[0][0], p[0][1], p[1][0], p[1][1]])


def fr_to_ark(x: int) -> Scalar:
    """An integer as an arkworks scalar of Fr (reduced mod r)."""
    return Scalar.from_le_bytes((x % R_MOD).to_bytes(32, "little"))


def _xy_bytes(coords: list[int]) -> bytes:
    return b"".join(c.to_bytes(FQ_BYTES, "little") for c in coords)


def g1_to_ark(p: G1Affine, *, checked: bool = False) -> G1Point:
    """Affine ints -> arkworks G1Point; ``checked`` also tests the curve and subgroup (ValueError)."""
    if p is None:
        return G1Point.identity()
    data = _xy_bytes([p[0], p[1]])
    return G1Point.from_xy_bytes_le(data) if checked else G1Point.from_xy_bytes_unchecked_le(data)


def g2_to_ark(p: G2Affine, *, checked: bool = False) -> G2Point:
    """Affine ints -> arkworks G2Point; ``checked`` also tests the curve and subgroup (ValueError)."""
    if p is None:
        return G2Point.identity()
    data = _xy_bytes([p[0][0], p[0][1], p[1][0], p[1][1]])
    return G2Point.from_xy_bytes_le(data) if checked else G2Point.from_xy_bytes_unchecked_le(data)


def _ints_from_xy_bytes(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + FQ_BYTES], "little") for i in range(0, len(data), FQ_BYTES)]


def ark_to_g1(p: G1Point) -> G1Affine:
    """arkworks G1Point -> affine ints."""
    data = p.to_xy_bytes_le()
    if not any(data):
        return None
    x, y = _ints_from_xy_bytes(data)
    return (x, y)


def ark_to_g2(p: G2Point) -> G2Affine:
    """arkworks G2Point -> affine ints."""
    data = p.to_xy_bytes_le()
    if not any(data):
        return None
    x0, x1, y0, y1 = _ints_from_xy_bytes(data)
    return ((x0, x1), (y0, y1))


def lem_to_xy_bytes(points: np.ndarray) -> bytes:
    """A whole ``(n, 12)`` or ``(n, 24)`` zkey-layout array -> standard LE ``x || y`` bytes.

    Infinity (all-zero rows) stays all zeros, which is also arkworks' encoding.
    """
    n, width = points.shape
    flat = np.ascontiguousarray(points, dtype=np.uint64).reshape(n * width // 6, 6)
    return fq.from_mont(flat).tobytes()


def g1_lem_to_ark_list(points: np.ndarray) -> list[G1Point]:
    """``(n, 12)`` zkey-layout G1 points -> arkworks objects (no subgroup checks: trusted key)."""
    return _ark_list(lem_to_xy_bytes(points), 2 * FQ_BYTES, G1Point.from_xy_bytes_unchecked_le)


def g2_lem_to_ark_list(points: np.ndarray) -> list[G2Point]:
    """``(n, 24)`` zkey-layout G2 points -> arkworks objects (no subgroup checks: trusted key)."""
    return _ark_list(lem_to_xy_bytes(points), 4 * FQ_BYTES, G2Point.from_xy_bytes_unchecked_le)


def _ark_list(data: bytes, step: int, make: Callable[[bytes], PointT]) -> list[PointT]:
    """``make`` over each ``step`` bytes; a point that is not on the curve is a ValueError naming
    its index."""
    out = []
    for i in range(0, len(data), step):
        try:
            out.append(make(data[i : i + step]))
        except ValueError as exc:
            raise ValueError(f"point {i // step}: {exc}") from None
    return out


def g1_lem_to_ark(row: np.ndarray) -> G1Point:
    """One zkey-layout G1 row -> arkworks."""
    return g1_to_ark(g1_from_lem(row))


def g2_lem_to_ark(row: np.ndarray) -> G2Point:
    """One zkey-layout G2 row -> arkworks."""
    return g2_to_ark(g2_from_lem(row))


def g1_ark_to_lem(p: G1Point) -> np.ndarray:
    """arkworks G1Point -> zkey-layout row."""
    return g1_to_lem(ark_to_g1(p))


def g2_ark_to_lem(p: G2Point) -> np.ndarray:
    """arkworks G2Point -> zkey-layout row."""
    return g2_to_lem(ark_to_g2(p))
