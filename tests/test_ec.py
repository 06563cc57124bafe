"""G1/G2 numba arithmetic and fixed-base multiplication against arkworks (py_arkworks_bls12381).

Every point in these tests is k * generator for a known k, so the oracle for any
combination of points is arkworks' own generator times the combined scalar.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_mp.algebra import ec, fr
from cuzk_mp.algebra.field import G1_GEN, G2_GEN, Q_MOD, R_MOD

SEED = 1130


def _rng(tag: int) -> random.Random:
    print(f"seed={SEED + tag}")
    return random.Random(SEED + tag)


def _ark(group: str, k: int):  # type: ignore[no-untyped-def]
    gen = G1Point() if group == "g1" else G2Point()
    return gen * Scalar.from_le_bytes_mod_order((k % R_MOD).to_bytes(32, "little"))


def _expected_rows(group: str, ks: list[int]) -> np.ndarray:
    """Oracle: k * G for each k, via arkworks, as zkey-layout rows."""
    pts = []
    for k in ks:
        b = _ark(group, k).to_xy_bytes_le()
        v = [int.from_bytes(b[i : i + 48], "little") for i in range(0, len(b), 48)]
        if not any(v):
            pts.append(None)
        elif group == "g1":
            pts.append((v[0], v[1]))
        else:
            pts.append(((v[0], v[1]), (v[2], v[3])))
    return ec.g1_rows(pts) if group == "g1" else ec.g2_rows(pts)


def _points(group: str, ks: list[int]) -> np.ndarray:
    """Affine rows of k * G computed by our own fixed-base code (checked separately below)."""
    return ec.fixed_base_g1(G1_GEN, _scalars(ks)) if group == "g1" else ec.fixed_base_g2(G2_GEN, _scalars(ks))


def _scalars(ks: list[int]) -> np.ndarray:
    return fr.from_ints([k % R_MOD for k in ks], mont=False)


def _mix(n: int, tag: int) -> list[int]:
    """0, 1, -1, small +-, powers of two, then random scalars (arkworks test-template mix)."""
    rng = _rng(tag)
    edge = [0, 1, 2, 3, R_MOD - 1, R_MOD - 2, 7, 255, 65535, 1 << 64, (1 << 254), R_MOD - (1 << 128), 12345]
    return (edge + [rng.randrange(R_MOD) for _ in range(n)])[:n]


@pytest.mark.parametrize("group", ["g1", "g2"])
def test_fixed_base_default_window(group: str) -> None:
    ks = _mix(40, 1)
    assert np.array_equal(_points(group, ks), _expected_rows(group, ks))


@pytest.mark.parametrize("group, window", [("g1", 1), ("g1", 2), ("g1", 7), ("g1", 16), ("g2", 3), ("g2", 13)])
def test_fixed_base_forced_window(group: str, window: int) -> None:
    ks = _mix(24, window)
    fn = ec.fixed_base_g1 if group == "g1" else ec.fixed_base_g2
    got = fn(G1_GEN if group == "g1" else G2_GEN, _scalars(ks), window=window)
    assert np.array_equal(got, _expected_rows(group, ks))


def test_fixed_base_other_base_and_edges() -> None:
    base_k = 987654321
    base = ec.g1_points(_expected_rows("g1", [base_k]))[0]
    ks = _mix(20, 3)
    assert np.array_equal(ec.fixed_base_g1(base, _scalars(ks)), _expected_rows("g1", [k * base_k for k in ks]))
    assert not ec.fixed_base_g1(None, _scalars(ks)).any()
    assert ec.fixed_base_g2(G2_GEN, np.zeros((0, 4), np.uint64)).shape == (0, 24)
    with pytest.raises(ValueError, match="not reduced"):
        ec.fixed_base_g1(G1_GEN, fr.from_ints([R_MOD - 1], mont=False) + np.array([[2, 0, 0, 0]], np.uint64))
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        ec.fixed_base_g1(G1_GEN, np.zeros((3, 6), np.uint64))


def _neg_ks(ks: list[int]) -> list[int]:
    return [(-k) % R_MOD for k in ks]


@pytest.mark.parametrize("group", ["g1", "g2"])
def test_add_affine_edge_cases(group: str) -> None:
    rng = _rng(4)
    a = [rng.randrange(1, R_MOD) for _ in range(6)]
    # rows: P+Q, P+P (doubling), P+(-P) (infinity), inf+Q, P+inf, inf+inf
    p_ks = [a[0], a[1], a[2], 0, a[4], 0]
    q_ks = [a[3], a[1], (-a[2]) % R_MOD, a[3], 0, 0]
    got = ec.add_affine(_points(group, p_ks), _points(group, q_ks))
    assert np.array_equal(got, _expected_rows(group, [x + y for x, y in zip(p_ks, q_ks)]))


@pytest.mark.parametrize("group", ["g1", "g2"])
def test_jacobian_formulas(group: str) -> None:
    rng = _rng(5)
    n = 8
    a = [rng.randrange(1, R_MOD) for _ in range(n)]
    b = [rng.randrange(1, R_MOD) for _ in range(n)]
    pa, pb = _points(group, a), _points(group, b)
    ja = ec.double_jacobian(ec.to_jacobian(pa))  # 2a G with Z != 1
    jb = ec.double_jacobian(ec.to_jacobian(pb))
    assert np.array_equal(ec.to_affine(ja), _expected_rows(group, [2 * x for x in a]))
    assert np.array_equal(ec.to_affine(ec.add_jacobian(ja, jb)), _expected_rows(group, [2 * x + 2 * y for x, y in zip(a, b)]))
    assert np.array_equal(ec.to_affine(ec.add_mixed(ja, pb)), _expected_rows(group, [2 * x + y for x, y in zip(a, b)]))


@pytest.mark.parametrize("group", ["g1", "g2"])
def test_jacobian_edge_cases(group: str) -> None:
    rng = _rng(6)
    a = rng.randrange(1, R_MOD)
    p, two_p = _points(group, [a]), _points(group, [2 * a])
    neg_two_p = _points(group, [-2 * a])
    j2 = ec.double_jacobian(ec.to_jacobian(p))  # Z != 1
    inf_j = ec.to_jacobian(_points(group, [0]))
    cases = [  # (Jacobian + Jacobian, expected multiple of a)
        (j2, ec.to_jacobian(two_p), 4),  # same point, different Z: doubles
        (j2, ec.to_jacobian(neg_two_p), 0),  # P + (-P)
        (inf_j, j2, 2),
        (j2, inf_j, 2),
        (inf_j, inf_j, 0),
    ]
    for x, y, k in cases:
        assert np.array_equal(ec.to_affine(ec.add_jacobian(x, y)), _expected_rows(group, [k * a])), k
    mixed = [(j2, two_p, 4), (j2, neg_two_p, 0), (inf_j, two_p, 2), (j2, _points(group, [0]), 2)]
    for x, y, k in mixed:
        assert np.array_equal(ec.to_affine(ec.add_mixed(x, y)), _expected_rows(group, [k * a])), k
    assert np.array_equal(ec.to_affine(ec.double_jacobian(inf_j)), _expected_rows(group, [0]))


def test_to_affine_chunks_with_infinity() -> None:
    rng = _rng(7)
    ks = [rng.randrange(R_MOD) if i % 5 else 0 for i in range(700)]  # several chunks, scattered infinities
    jac = ec.double_jacobian(ec.to_jacobian(_points("g1", ks)))
    got = ec.to_affine(jac)
    want = _expected_rows("g1", [2 * k for k in ks[:50]])
    assert np.array_equal(got[:50], want)
    assert not got[::5].any()


def test_row_conversions_roundtrip() -> None:
    assert ec.g1_points(ec.g1_rows([G1_GEN, None])) == [G1_GEN, None]
    assert ec.g2_points(ec.g2_rows([None, G2_GEN])) == [None, G2_GEN]
    rows = ec.g1_rows([G1_GEN])
    assert bytes(rows.tobytes()[:8]).hex() == "160c53fd9087b35c"  # snarkjs-formats.md check value (LEM x)
    assert ec.g1_points(rows)[0][0] < Q_MOD


def test_window_choice() -> None:
    assert ec.window_bits(1) <= 3
    assert ec.window_bits(1 << 16) == 13
    assert ec.window_bits(1 << 24) == ec.MAX_WINDOW
