"""The prover and verifier on real snarkjs files (tests/data_formats, made by circom + snarkjs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import curve
from cuzk_mp.algebra.field import Q_MOD, R_MOD, ints_to_limbs, limbs_to_ints
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.errors import FormatError, UnsatisfiedWitness, VerificationFailed
from cuzk_mp.formats.r1cs import read_r1cs
from cuzk_mp.formats.snarkjs_json import Proof, proof_from_json, public_from_json, vk_from_json, vk_to_json
from cuzk_mp.formats.wtns import read_wtns
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16.keys import prepared_vk_of, vk_from_zkey
from cuzk_mp.groth16.prover import header_points, prove
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.groth16.verifier import check, pairing_holds, verify

DATA = Path(__file__).parent / "data_formats"


@pytest.fixture(scope="module")
def backend() -> CpuBackend:
    return CpuBackend()


@pytest.fixture(scope="module")
def zkey():  # type: ignore[no-untyped-def]
    return read_zkey(DATA / "mul.zkey")


def test_exported_vk_equals_snarkjs(zkey) -> None:  # type: ignore[no-untyped-def]
    assert vk_to_json(vk_from_zkey(zkey)) == json.loads((DATA / "verification_key.json").read_text())


def test_prove_verify_and_tamper(backend: CpuBackend, zkey) -> None:  # type: ignore[no-untyped-def]
    w = read_wtns(DATA / "mul.wtns")
    vk = vk_from_zkey(zkey)
    proof, public = prove(backend, zkey, w, r1cs=read_r1cs(DATA / "mul.r1cs"))
    assert public == public_from_json(json.loads((DATA / "public.json").read_text()))
    assert verify(vk, public, proof)
    # a wrong public input, and each proof point replaced by another valid point, fail
    assert check(vk, [public[0] + 1] + public[1:], proof) == "pairing check failed: the proof does not match"
    other, _ = prove(backend, zkey, w)
    assert other != proof  # fresh r, s every time
    for field in ("pi_a", "pi_b", "pi_c"):
        mixed = Proof(**{**proof.__dict__, field: getattr(other, field)})
        assert not verify(vk, public, mixed)
    off_curve = Proof(pi_a=(proof.pi_a[0], (proof.pi_a[1] + 1)), pi_b=proof.pi_b, pi_c=proof.pi_c)
    assert "not a point of G1" in (check(vk, public, off_curve) or "")
    assert check(vk, public[:-1], proof) is not None
    assert check(vk, [R_MOD] + public[1:], proof) is not None


def test_snarkjs_proof_verifies(zkey) -> None:  # type: ignore[no-untyped-def]
    vk = vk_from_json(json.loads((DATA / "verification_key.json").read_text()))
    proof = proof_from_json(json.loads((DATA / "proof.json").read_text()))
    public = public_from_json(json.loads((DATA / "public.json").read_text()))
    assert check(vk, public, proof) is None


def test_unsatisfied_witness_is_refused(backend: CpuBackend, zkey) -> None:  # type: ignore[no-untyped-def]
    w = read_wtns(DATA / "mul.wtns").copy()
    vals = limbs_to_ints(w)
    vals[-1] = (vals[-1] + 1) % R_MOD  # break the last internal wire
    bad = ints_to_limbs(vals, 4)
    r1cs = read_r1cs(DATA / "mul.r1cs")
    with pytest.raises(UnsatisfiedWitness, match="does not satisfy constraint") as info:
        prove(backend, zkey, bad, r1cs=r1cs)
    assert 0 <= info.value.constraint < r1cs.n_constraints
    with pytest.raises(VerificationFailed):  # without the r1cs the self-check still catches it
        prove(backend, zkey, bad)


def test_witness_shape_and_range_errors(zkey) -> None:  # type: ignore[no-untyped-def]
    ev = ConstraintEvaluator.from_zkey(zkey)
    w = read_wtns(DATA / "mul.wtns")
    with pytest.raises(Exception, match="wires"):
        ev.evaluate(w[:-1])
    w2 = w.copy()
    w2[0] = np.array([2, 0, 0, 0], dtype=np.uint64)
    with pytest.raises(Exception, match="must be 1"):
        ev.evaluate(w2)
    w3 = w.copy()
    w3[2] = np.array([2**64 - 1] * 4, dtype=np.uint64)
    with pytest.raises(Exception, match="not a field element"):
        ev.evaluate(w3)


def g1_outside_the_subgroup() -> tuple[int, int]:
    """A point of E(Fq) that is not in G1 (the cofactor is ~2^126: any point found this way)."""
    x = 5
    while pow((x**3 + 4) % Q_MOD, (Q_MOD - 1) // 2, Q_MOD) != 1:
        x += 1
    return x, pow((x**3 + 4) % Q_MOD, (Q_MOD + 1) // 4, Q_MOD)


@pytest.mark.parametrize(("field", "row", "message"), [
    ("alpha1", curve.g1_to_lem((1, 1)), r"section 2 \(header\): alpha1 is not a point of G1: .*not on the G1 curve"),
    ("beta1", curve.g1_to_lem(g1_outside_the_subgroup()),
     r"section 2 \(header\): beta1 is not a point of G1: .*not in the correct G1 subgroup"),
    ("delta2", curve.g2_to_lem(((1, 0), (1, 0))), r"section 2 \(header\): delta2 is not a point of G2: .*G2 curve"),
    ("ic", None, r"section 3 \(IC\): point 1 is not a point of G1: .*not on the G1 curve"),
])
def test_a_bad_fixed_point_is_named(zkey, field: str, row: np.ndarray | None,  # type: ignore[no-untyped-def]
                                    message: str) -> None:
    """A header or IC point off its curve or outside its subgroup: the file, section and point are
    named (exit code 2 at the command line), by the verifying key's export and by the prover."""
    if row is None:
        row = zkey.ic.copy()
        row[1] = curve.g1_to_lem((1, 1))
    bad = dataclasses.replace(zkey, **{field: row})
    with pytest.raises(FormatError, match=rf"mul\.zkey, {message}"):
        vk_from_zkey(bad)
    bad = dataclasses.replace(zkey, **{field: row})  # a fresh object: the check runs once per key
    with pytest.raises(FormatError, match=message):
        header_points(bad)


def test_a_point_off_the_curve_in_a_large_section_is_named(backend: CpuBackend, zkey) -> None:  # type: ignore[no-untyped-def]
    for field, point in (("h", curve.g1_to_lem((1, 1))), ("b2", curve.g2_to_lem(((1, 0), (1, 0))))):
        rows = getattr(zkey, field).copy()
        rows[2] = point
        label = {"h": "9 \\(H\\)", "b2": "7 \\(B2\\)"}[field]
        with pytest.raises(FormatError, match=rf"mul\.zkey, section {label}: point 2: point is not on the G[12] curve"):
            backend.load_key(dataclasses.replace(zkey, **{field: rows}))


def test_a_key_point_with_a_small_order_part_gives_no_proof(backend: CpuBackend, zkey) -> None:  # type: ignore[no-untyped-def]
    """(0, 2) has order 3 on y^2 = x^3 + 4 and pairs to 1. Added to the A point of a wire whose
    value is not 0 mod 3 (the big sections are converted with the curve check alone), it reaches
    pi_a: the pairing equation still holds, but pi_a is outside G1, so the proof must not come out."""
    w = read_wtns(DATA / "mul.wtns")
    i = next(k for k, v in enumerate(limbs_to_ints(w)) if v % 3)
    rows = zkey.a.copy()
    rows[i] = curve.g1_ark_to_lem(curve.g1_lem_to_ark(zkey.a[i]) + curve.g1_to_ark((0, 2)))
    bad_key = dataclasses.replace(zkey, a=rows)
    with pytest.raises(VerificationFailed, match="self-verification"):
        prove(backend, bad_key, w)
    proof, public = prove(backend, bad_key, w, verify=False)
    assert (check(vk_from_zkey(zkey), public, proof)
            == "pi_a is not a point of G1 (not on the curve or not in the subgroup)")
    a, b, c = curve.g1_to_ark(proof.pi_a), curve.g2_to_ark(proof.pi_b), curve.g1_to_ark(proof.pi_c)
    assert pairing_holds(prepared_vk_of(zkey), public, a, b, c)  # what the pairing check alone would let through


def test_a_damaged_key_with_a_satisfying_witness_is_named(backend: CpuBackend, zkey) -> None:  # type: ignore[no-untyped-def]
    """With the r1cs given the witness is checked: a proof that then fails its self-check comes from
    the key, and the message says so rather than ask for the r1cs it already has."""
    w = read_wtns(DATA / "mul.wtns")
    damaged = dataclasses.replace(zkey, h=np.ascontiguousarray(zkey.h[::-1]))  # valid points, wrong places
    with pytest.raises(VerificationFailed) as info:
        prove(backend, damaged, w, r1cs=read_r1cs(DATA / "mul.r1cs"))
    assert "the witness satisfies the r1cs" in str(info.value)
    assert "give the .r1cs" not in str(info.value)
    with pytest.raises(VerificationFailed, match=r"give the \.r1cs"):  # unchecked witness: either may be at fault
        prove(backend, damaged, w)
