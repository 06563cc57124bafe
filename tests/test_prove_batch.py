"""Proving k partitions of one key in one pass (``prove_start_batch`` and ``msm_batch``).

On the CPU backend, with the porep-like 2^10 test key and distinct witnesses: the batched
MSM sums equal the one-by-one sums, section by section; every batched proof verifies with
the key's verification key (and fails with another partition's public signals); the
one-shot ``prove`` (key loaded beside the witness map, for that proof alone) verifies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.backends.base import Backend, MsmSums
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.errors import InputError
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16.keys import prepare_vk, vk_from_zkey
from cuzk_mp.groth16.prover import (
    prove, prove_finalize, prove_start, prove_start_batch, public_signals,
)
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.groth16.verifier import verify
from tests.helpers import LOG_N

SEEDS = (3, 4, 5)


@pytest.fixture(scope="module")
def cpu() -> CpuBackend:
    backend = CpuBackend(threads=2)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def setup(test_key: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    zkey = read_zkey(test_key[0])
    circuit = PorepLike(LOG_N)
    evaluator = ConstraintEvaluator.from_zkey(zkey)
    inputs = [evaluator.evaluate(circuit.witness(seed, 0)) for seed in SEEDS]
    yield zkey, inputs
    zkey.close()


def _sums_by_section(s: MsmSums) -> dict[str, object]:
    return {name: getattr(s, name) for name in ("a", "b1", "b2", "c", "h")}


def _one_by_one(backend: Backend, key: object, zkey, inputs) -> list[MsmSums]:  # type: ignore[no-untyped-def]
    out = []
    for x in inputs:
        staged = backend.stage(key, x)
        try:
            out.append(prove_start(backend, key, staged, zkey.n_public))
        finally:
            backend.release(staged)
    return out


def test_batched_sums_equal_one_by_one_and_proofs_verify(cpu: CpuBackend, setup) -> None:  # type: ignore[no-untyped-def]
    zkey, inputs = setup
    key = cpu.load_key(zkey)
    lone = _one_by_one(cpu, key, zkey, inputs)
    staged = [cpu.stage(key, x) for x in inputs]
    try:
        batched = prove_start_batch(cpu, key, staged, zkey.n_public)
    finally:
        for s in staged:
            cpu.release(s)
    assert len(batched) == len(inputs)
    for i, (b, one) in enumerate(zip(batched, lone)):
        assert _sums_by_section(b) == _sums_by_section(one), f"partition {i}"
    assert _sums_by_section(batched[0]) != _sums_by_section(batched[1])  # distinct witnesses, distinct sums
    pvk = prepare_vk(vk_from_zkey(zkey))
    publics = [public_signals(x.w, zkey.n_public) for x in inputs]
    for sums, public in zip(batched, publics):
        proof = prove_finalize(zkey, sums, public)
        assert verify(pvk, public, proof)
    other = prove_finalize(zkey, batched[0], publics[0])
    assert publics[0] != publics[1] and not verify(pvk, publics[1], other)


def test_msm_batch_checks_every_vector(cpu: CpuBackend, setup) -> None:  # type: ignore[no-untyped-def]
    zkey, inputs = setup
    key = cpu.load_key(zkey)
    w = inputs[0].w
    futs = cpu.msm_batch(key, "a", [w, inputs[1].w])
    assert [f.result() for f in futs] == [cpu.msm(key, "a", w).result(), cpu.msm(key, "a", inputs[1].w).result()]
    assert cpu.msm_batch(key, "a", []) == []
    with pytest.raises(InputError, match="'c'"):
        cpu.msm_batch(key, "c", [w[zkey.n_public + 1 :], w])  # the second has one scalar per wire: too many


def test_one_shot_prove_loads_the_key_beside_the_witness_map(setup) -> None:  # type: ignore[no-untyped-def]
    zkey, _ = setup
    backend = CpuBackend(threads=2)
    try:
        w = PorepLike(LOG_N).witness(SEEDS[0], 0)
        proof, public = prove(backend, zkey, w)
        assert verify(prepare_vk(vk_from_zkey(zkey)), public, proof)
        with pytest.raises(InputError, match="witness has 3 values"):  # the key loaded beside it is closed
            prove(backend, zkey, np.zeros((3, 4), dtype=np.uint64))
    finally:
        backend.close()
