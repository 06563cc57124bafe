"""Finalizing k proofs of one key together (``prove_finalize_batch``, ``batch_pairing_holds``).

On the CPU backend with the porep-like 2^10 test key and four distinct witnesses: a batch of
valid proofs passes the one pairing check and each proof verifies alone, with ours and with
snarkjs; one tampered proof at any position makes the batch check fail, and the prover's
one-by-one fallback fails exactly that proof, as does a proof point outside its subgroup
(which the pairing checks cannot see); one proof alone is the former path (the same
points for the same r, s, the textbook pi_c). A failing proof names the key only where its own
witness was checked against the r1cs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from py_arkworks_bls12381 import G1Point

from cuzk_mp.algebra import curve
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.errors import VerificationFailed
from cuzk_mp.formats.snarkjs_json import Proof, proof_to_json, public_to_json, vk_to_json
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16 import prover as prover_mod
from cuzk_mp.groth16.keys import prepared_vk_of, vk_from_zkey
from cuzk_mp.groth16.prover import (
    header_points, prove_finalize, prove_finalize_batch, prove_start_batch, public_signals,
)
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.groth16.verifier import PairingItem, batch_pairing_holds, pairing_holds, verify
from tests.helpers import LOG_N, snarkjs_verify

SEEDS = (41, 42, 43, 44)


@pytest.fixture(scope="module")
def setup(test_key: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    zkey = read_zkey(test_key[0])
    evaluator = ConstraintEvaluator.from_zkey(zkey)
    inputs = [evaluator.evaluate(PorepLike(LOG_N).witness(seed, 0)) for seed in SEEDS]
    backend = CpuBackend(threads=2)
    key = backend.load_key(zkey)
    staged = [backend.stage(key, x) for x in inputs]
    try:
        sums = prove_start_batch(backend, key, staged, zkey.n_public)  # type: ignore[arg-type]
    finally:
        for s in staged:
            backend.release(s)
        key.close()
        backend.close()
    items = [(s, public_signals(x.w, zkey.n_public)) for s, x in zip(sums, inputs)]
    yield SimpleNamespace(zkey=zkey, items=items, pvk=prepared_vk_of(zkey))
    zkey.close()


def _checks(proofs: list[Proof], items: list) -> list[PairingItem]:  # type: ignore[type-arg]
    return [(public, curve.g1_to_ark(p.pi_a), curve.g2_to_ark(p.pi_b), curve.g1_to_ark(p.pi_c))
            for p, (_, public) in zip(proofs, items)]


def test_batch_of_valid_proofs_verifies_with_ours_and_snarkjs(setup: SimpleNamespace) -> None:
    results = prove_finalize_batch(setup.zkey, setup.items)
    assert all(isinstance(p, Proof) for p in results)
    proofs: list[Proof] = results  # type: ignore[assignment]
    assert len({p.pi_a for p in proofs}) == len(proofs)  # each with its own r
    assert batch_pairing_holds(setup.pvk, _checks(proofs, setup.items))
    for p, (_, public) in zip(proofs, setup.items):
        assert verify(setup.pvk, public, p)
    snarkjs_verify(vk_to_json(vk_from_zkey(setup.zkey)),
                   [(public_to_json(public), proof_to_json(p)) for p, (_, public) in zip(proofs, setup.items)])


def test_one_tampered_proof_fails_the_batch_at_every_position(setup: SimpleNamespace) -> None:
    proofs: list[Proof] = prove_finalize_batch(setup.zkey, setup.items, verify=False)  # type: ignore[assignment]
    good = _checks(proofs, setup.items)
    one = G1Point()
    for j in range(len(good)):
        public, a, b, c = good[j]
        for bad in ((public, a, b, c + one), ([(public[0] + 1), *public[1:]], a, b, c)):
            tampered = [*good[:j], bad, *good[j + 1:]]
            assert not batch_pairing_holds(setup.pvk, tampered), f"position {j}"
            assert [pairing_holds(setup.pvk, *t) for t in tampered] == [i != j for i in range(len(good))]


def test_fallback_fails_exactly_the_bad_proof(setup: SimpleNamespace) -> None:
    one = G1Point()
    for j in range(len(setup.items)):
        sums, public = setup.items[j]
        items = [*setup.items[:j], (replace(sums, h=sums.h + one), public), *setup.items[j + 1:]]
        results = prove_finalize_batch(setup.zkey, items)
        assert [isinstance(r, VerificationFailed) for r in results] == [i == j for i in range(len(items))]
        for r, (_, pub) in zip(results, items):
            if isinstance(r, Proof):
                assert verify(setup.pvk, pub, r)
        with pytest.raises(VerificationFailed, match="self-verification"):
            prove_finalize(setup.zkey, *items[j])


def test_a_proof_point_outside_its_subgroup_fails_alone(setup: SimpleNamespace) -> None:
    """A sum with a component of order 3 ((0, 2) on y^2 = x^3 + 4, from a key point that carries it)
    pairs like the sum without it, so the pairing checks pass; the subgroup check fails that proof."""
    order3 = curve.g1_to_ark((0, 2))
    for j, field in ((0, "a"), (2, "c")):
        sums, public = setup.items[j]
        items = [*setup.items[:j], (replace(sums, **{field: getattr(sums, field) + order3}), public),
                 *setup.items[j + 1:]]
        results = prove_finalize_batch(setup.zkey, items)
        assert [isinstance(r, VerificationFailed) for r in results] == [i == j for i in range(len(items))]
        for r, (_, pub) in zip(results, items):
            if isinstance(r, Proof):
                assert verify(setup.pvk, pub, r)
        with pytest.raises(VerificationFailed, match="self-verification"):
            prove_finalize(setup.zkey, *items[j])


def test_one_proof_is_the_former_path(setup: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    sums, public = setup.items[0]
    r, s = 0x1234567 * 2**200 + 99, 0xABCDEF * 2**190 + 7
    draws = iter([r, s, r, s])
    monkeypatch.setattr(prover_mod, "random_scalar", lambda: next(draws))
    hp, fr = header_points(setup.zkey), curve.fr_to_ark
    pi_a = hp.alpha1 + sums.a + hp.delta1 * fr(r)  # snarkjs groth16_prove.js, term by term
    pi_b = hp.beta2 + sums.b2 + hp.delta2 * fr(s)
    b1 = hp.beta1 + sums.b1 + hp.delta1 * fr(s)
    pi_c = sums.c + sums.h + pi_a * fr(s) + b1 * fr(r) - hp.delta1 * fr(r * s)
    textbook = Proof(pi_a=curve.ark_to_g1(pi_a), pi_b=curve.ark_to_g2(pi_b), pi_c=curve.ark_to_g1(pi_c))
    assert prove_finalize(setup.zkey, sums, public) == textbook
    assert prove_finalize_batch(setup.zkey, [(sums, public)]) == [textbook]
    check = _checks([textbook], [setup.items[0]])[0]
    wrong = ([public[0] + 1, *public[1:]], *check[1:])
    assert batch_pairing_holds(setup.pvk, [check]) is pairing_holds(setup.pvk, *check) is True
    assert batch_pairing_holds(setup.pvk, [wrong]) is pairing_holds(setup.pvk, *wrong) is False  # type: ignore[arg-type]


def test_batch_check_wants_every_public_signal(setup: SimpleNamespace) -> None:
    proofs: list[Proof] = prove_finalize_batch(setup.zkey, setup.items[:2], verify=False)  # type: ignore[assignment]
    good = _checks(proofs, setup.items[:2])
    with pytest.raises(ValueError, match=f"expected {setup.pvk.n_public} public signals"):
        batch_pairing_holds(setup.pvk, [good[0], (good[1][0][:-1], *good[1][1:])])  # type: ignore[list-item]
    assert batch_pairing_holds(setup.pvk, [])


def test_each_proof_of_a_batch_says_whether_its_witness_was_checked(setup: SimpleNamespace) -> None:
    """Proofs of one key finalized together may come from witnesses checked against the r1cs and from
    witnesses that were not: a failing proof's message names the key only where its own witness was
    checked, and leaves the witness in doubt where it was not."""
    one = G1Point()
    items = [(replace(sums, h=sums.h + one), public) for sums, public in setup.items[:2]]
    checked, unchecked = prove_finalize_batch(setup.zkey, items, witness_checked=[True, False])
    assert isinstance(checked, VerificationFailed) and isinstance(unchecked, VerificationFailed)
    assert str(checked) == ("the proof did not pass self-verification although the witness satisfies the r1cs: "
                            "the proving key does not match this circuit or is damaged")
    assert "give the .r1cs to find the failing constraint" in str(unchecked)
