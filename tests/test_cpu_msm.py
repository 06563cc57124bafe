"""CPU MSM (arkworks with the 0/1 split) against a naive sum of scalar multiplications."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_mp.algebra import curve
from cuzk_mp.algebra.field import R_MOD, ints_to_limbs
from cuzk_mp.backends.cpu import msm

scalars_st = st.one_of(st.sampled_from([0, 1, 2, R_MOD - 1]), st.integers(min_value=0, max_value=R_MOD - 1))


def _naive(points: list, scalars: list[int], identity):  # type: ignore[no-untyped-def]
    acc = identity
    for p, s in zip(points, scalars):
        acc = acc + p * Scalar.from_le_bytes(s.to_bytes(32, "little"))
    return acc


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=2**64), scalars_st), min_size=0, max_size=24), st.booleans())
def test_g1_msm_matches_naive(pairs: list[tuple[int, int]], repeat: bool) -> None:
    g = G1Point()
    points = [g * Scalar(k) for k, _ in pairs]
    if repeat and points:
        points = [points[0]] * len(points)  # repeated points land in the same buckets
    scalars = [s for _, s in pairs]
    got = msm(points, ints_to_limbs(scalars, 4).reshape(-1, 4), G1Point.identity())
    assert got == _naive(points, scalars, G1Point.identity())


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=2**64), scalars_st), min_size=1, max_size=8))
def test_g2_msm_matches_naive(pairs: list[tuple[int, int]]) -> None:
    g = G2Point()
    points = [g * Scalar(k) for k, _ in pairs]
    scalars = [s for _, s in pairs]
    got = msm(points, ints_to_limbs(scalars, 4), G2Point.identity())
    assert got == _naive(points, scalars, G2Point.identity())


def test_size_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="size mismatch"):
        msm([G1Point()] * 3, ints_to_limbs([1, 2], 4), G1Point.identity())


def test_zkey_layout_round_trip_and_infinity() -> None:
    g = G1Point() * Scalar(123456789)
    row = curve.g1_ark_to_lem(g)
    assert curve.g1_lem_to_ark(row) == g
    pts = np.stack([row, np.zeros(12, dtype=np.uint64), row])
    objs = curve.g1_lem_to_ark_list(pts)
    assert objs[0] == g and objs[1] == G1Point.identity() and objs[2] == g
    h = G2Point() * Scalar(987654321)
    assert curve.g2_lem_to_ark(curve.g2_ark_to_lem(h)) == h
    assert curve.g2_lem_to_ark_list(np.zeros((1, 24), dtype=np.uint64))[0] == G2Point.identity()
    # the generator's zkey bytes start as snarkjs-formats.md says (Montgomery, little-endian)
    gen = curve.g1_ark_to_lem(G1Point()).tobytes()
    assert gen[:8].hex() == "160c53fd9087b35c"


def test_backend_protocol_primitives_on_the_cpu() -> None:
    """msm() returns a Future per key section (count checked, naming both counts); h_values() consumes
    the staged a, b, c; the recipe's C MSM over w[n_public+1:] equals a naive sum."""
    from concurrent.futures import Future
    from pathlib import Path

    from cuzk_mp.backends.base import ProverInputs
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.errors import InputError
    from cuzk_mp.formats.wtns import read_wtns
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    data = Path(__file__).parent / "data_formats"
    backend = CpuBackend(threads=2)
    with read_zkey(data / "mul.zkey") as zkey:
        key = backend.load_key(zkey)
        inputs = ConstraintEvaluator.from_zkey(zkey).evaluate(read_wtns(data / "mul.wtns"))
        staged = backend.stage(key, inputs)
        w = staged.w
        assert w is not None and w is not inputs.w  # a private copy: the ring slot may go
        fut = backend.msm(key, "c", w[zkey.n_public + 1 :])
        assert isinstance(fut, Future)
        want = _naive(curve.g1_lem_to_ark_list(zkey.c), [int(x) for x in _ints(w[zkey.n_public + 1 :])],
                      G1Point.identity())
        assert fut.result() == want
        with pytest.raises(InputError, match=r"'c'.*\b%d\b.*\b%d\b" % (zkey.n_vars, zkey.c.shape[0])):
            backend.msm(key, "c", w)  # the whole witness is one scalar per wire: too many for section 8
        h = backend.h_values(key, staged)
        assert h.shape == (zkey.domain_size, 4) and staged.a is None and staged.c is None
        np.testing.assert_array_equal(h, backend.coset_h(inputs.a, inputs.b, inputs.c))
        backend.release(staged)
        backend.release(staged)  # idempotent
        assert staged.w is None
        assert isinstance(ProverInputs(inputs.a, inputs.b, inputs.c, inputs.w).nbytes, int)
    backend.close()


def _ints(limbs: np.ndarray) -> list[int]:
    from cuzk_mp.algebra.field import limbs_to_ints

    return limbs_to_ints(limbs)
