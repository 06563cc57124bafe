"""Tests of the dense-random synthetic circuit (cuzk_mp.circuits.synthetic_dense) and of the
synthetic kinds registry.

Oracles as for PorepLike (tests/test_synthetic.py): the constraint check done two independent
ways (numba CSR mat-vec on Montgomery forms; Python ints row by row at 2^10), the recurrence
re-derived with Python ints, ``snarkjs wtns check`` on the written files, and Groth16 proofs at
2^10 - snarkjs's and ours (``cuzk-mp groth16 prove`` on the snarkjs key) - that snarkjs verifies
and that fail with a wrong public input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.field import R_MOD, domain_log_size, limbs_to_ints
from cuzk_mp.circuits.synthetic_dense import ALPHA_PERIOD, BETA_PERIOD, DenseRandom
from cuzk_mp.circuits.synthetic_kinds import SYNTHETIC_KINDS, synthetic_circuit, write_synthetic
from cuzk_mp.errors import ConfigError, InputError
from cuzk_mp.formats.r1cs import read_r1cs
from cuzk_mp.formats.wtns import read_wtns, write_wtns
from tests.oracle import oracle  # noqa: F401 - the session fixture
from tests.oracle import (
    Oracle, cuzk, export_vk, groth16_prove, groth16_setup, groth16_verify, require_tools, wtns_check,
)
from tests.test_synthetic import binary, failing_rows, python_failing_rows


@pytest.mark.parametrize("log_n", [10, 11, 13, 16])
@pytest.mark.parametrize("n_public", [1, 4])
def test_domain_is_exactly_2k_and_every_wire_is_used(log_n: int, n_public: int) -> None:
    c = DenseRandom(log_n, n_public)
    r = c.r1cs()
    assert r.n_constraints == c.n_constraints == (1 << log_n) - n_public - 1
    assert domain_log_size(r.n_constraints + r.n_public + 1) == log_n
    assert (r.n_wires, r.n_pub_out, r.n_pub_in) == (c.n_wires, n_public - 1, 1)
    assert c.n_wires - c.domain_size <= 2 * c.lanes  # about one wire per row
    for m in (r.a, r.b, r.c):
        assert m.n_rows == r.n_constraints and m.n_cols == r.n_wires
        assert np.all(np.diff(m.indptr) > 0) and int(m.indices.max()) < r.n_wires
        rows = np.repeat(np.arange(m.n_rows), np.diff(m.indptr))
        assert np.all(np.diff(m.indices.astype(np.int64))[np.diff(rows) == 0] > 0)  # sorted within a row
    used = np.zeros(r.n_wires, dtype=bool)
    for m in (r.a, r.b, r.c):
        used[m.indices] = True
    assert used.all()


@pytest.mark.parametrize("log_n", [10, 12, 14])
def test_witness_satisfies_every_constraint_and_is_dense(log_n: int) -> None:
    c = DenseRandom(log_n)
    rng = np.random.default_rng(log_n)
    for _ in range(2):
        seed, partition = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32))
        w = c.witness(seed, partition)
        assert w.shape == (c.n_wires, 4) and fr.first_noncanonical(w) == -1
        assert failing_rows(c.r1cs(), w).size == 0, (seed, partition)
        chain = w[c.base :]
        assert binary(chain).sum() == 0  # no chain value is 0 or 1
        bits = np.array([v.bit_length() for v in limbs_to_ints(chain)])
        assert np.median(bits) >= 252 and bits.min() >= 200  # full-width values


def test_python_int_oracle_agrees_with_the_recurrence() -> None:
    c = DenseRandom(10)
    seed, partition = 11, 4
    w = c.witness(seed, partition)
    assert python_failing_rows(c.r1cs(), w) == []
    v = limbs_to_ints(w[c.base :])
    L = c.lanes
    x = limbs_to_ints(c.chain_inputs(seed, partition))
    mont_inv = pow(2**256, -1, R_MOD)  # the inputs are read as Montgomery representatives
    assert v[: 2 * L] == [xi * mont_inv % R_MOD for xi in x]
    for i in range(2 * L, c.m):
        a = v[i - 2 * L] + 1 + i % ALPHA_PERIOD + (partition if i == 2 * L else 0)
        assert v[i] == a * (v[i - L] + 2 + i % BETA_PERIOD) % R_MOD, i
    assert limbs_to_ints(w[1 : c.n_public + 1]) == [v[c.m - 1 - j] for j in range(c.n_pub_out)] + [partition]
    assert c.public_inputs(seed, partition) == limbs_to_ints(w[1 : c.n_public + 1])


def test_witness_into_same_bytes_for_any_thread_count() -> None:
    c = DenseRandom(14)
    ref = c.witness(3, 8)
    for threads in (1, 2, 64):
        buf = np.full((c.n_wires, 4), 0x5A5A, dtype=np.uint64)
        c.witness_into(3, 8, buf, threads=threads)
        assert np.array_equal(buf, ref), threads


def test_deterministic_witness_into_and_inputs_matter() -> None:
    a, b = DenseRandom(12), DenseRandom(12)
    w = a.witness(5, 9)
    assert np.array_equal(w, b.witness(5, 9))
    buf = np.full((b.n_wires + 10, 4), 0xDEADBEEF, dtype=np.uint64)
    b.witness_into(5, 9, buf[3 : 3 + b.n_wires])
    assert np.array_equal(buf[3 : 3 + b.n_wires], w)
    assert np.all(buf[:3] == 0xDEADBEEF) and np.all(buf[3 + b.n_wires :] == 0xDEADBEEF)
    pubs = [a.public_inputs(s, p) for s, p in ((5, 9), (5, 10), (6, 9))]
    assert all(x[:-1] != y[:-1] for i, x in enumerate(pubs) for y in pubs[i + 1 :])


def test_broken_witnesses_are_caught() -> None:
    c = DenseRandom(11)
    r, w = c.r1cs(), c.witness(3, 4)
    rng = np.random.default_rng(7)
    for wire in [*rng.choice(np.arange(c.base, c.n_wires), 8, replace=False), *range(1, c.n_public + 1)]:
        bad = w.copy()
        bad[wire] = fr.from_ints([limbs_to_ints(w[wire])[0] + 1], mont=False)
        assert failing_rows(r, bad).size > 0, wire  # every wire, public ones included, is bound


def test_bad_arguments_and_the_registry() -> None:
    with pytest.raises(ConfigError, match="log_n"):
        DenseRandom(9)
    with pytest.raises(ConfigError, match="n_public"):
        DenseRandom(12, 0)
    c = DenseRandom(10)
    with pytest.raises(InputError, match="partition"):
        c.witness(0, 1 << 32)
    with pytest.raises(InputError, match="seed"):
        c.public_inputs(-1, 0)
    with pytest.raises(InputError, match=rf"\({c.n_wires}, 4\) uint64"):
        c.witness_into(0, 0, np.zeros((c.n_wires - 1, 4), dtype=np.uint64))
    assert SYNTHETIC_KINDS == ("porep-like", "dense-random")
    assert [type(synthetic_circuit(k, 10)).__name__ for k in SYNTHETIC_KINDS] == ["PorepLike", "DenseRandom"]
    with pytest.raises(ConfigError, match="'sparse' is not one of porep-like, dense-random"):
        synthetic_circuit("sparse", 10)


def test_write_synthetic_and_the_cli_read_back(tmp_path: Path) -> None:
    r1cs_path, wtns_path = write_synthetic("dense-random", 10, tmp_path / "api", seed=4, partition=6)
    assert (r1cs_path.name, wtns_path.name) == ("dense-random-10.r1cs", "dense-random-10.wtns")
    proc = cuzk("circuit", "dense-random", "--log-n", "10", "--seed", "4", "--partition", "6", tmp_path / "cli")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli" / "dense-random-10.wtns").read_bytes() == wtns_path.read_bytes()
    assert (tmp_path / "cli" / "dense-random-10.r1cs").read_bytes() == r1cs_path.read_bytes()
    c = DenseRandom(10)
    back, w = read_r1cs(r1cs_path), read_wtns(wtns_path)
    assert np.array_equal(w, c.witness(4, 6))
    for m in "abc":
        mb, mr = getattr(back, m), getattr(c.r1cs(), m)
        assert np.array_equal(mb.indptr, mr.indptr) and np.array_equal(mb.indices, mr.indices)
        assert np.array_equal(mb.data, mr.data)


@pytest.mark.snarkjs
def test_snarkjs_checks_and_both_provers_verify(tmp_path: Path, oracle: Oracle) -> None:
    """At 2^10 the circuit fits the oracle's 2^10 ptau exactly (a full domain)."""
    require_tools()
    r1cs_path, wtns_path = write_synthetic("dense-random", 10, tmp_path, seed=3, partition=5)
    assert wtns_check(r1cs_path, wtns_path)
    w = read_wtns(wtns_path)
    w[DenseRandom(10).base + 500, 0] ^= 1
    write_wtns(tmp_path / "broken.wtns", w)
    assert not wtns_check(r1cs_path, tmp_path / "broken.wtns")

    zkey = groth16_setup(r1cs_path, oracle.ptau(), tmp_path / "k.zkey")
    vk = export_vk(zkey, tmp_path / "vk.json")
    expected = DenseRandom(10).public_inputs(3, 5)
    for prover in ("snarkjs", "cuzk"):
        proof, public = tmp_path / f"{prover}_proof.json", tmp_path / f"{prover}_public.json"
        if prover == "snarkjs":
            groth16_prove(zkey, wtns_path, proof, public)
        else:
            run = cuzk("groth16", "prove", zkey, wtns_path, proof, public, "--r1cs", r1cs_path)
            assert run.returncode == 0, run.stderr
        signals = json.loads(public.read_text())
        assert [int(x) for x in signals] == expected
        assert groth16_verify(vk, public, proof), prover
        bad = tmp_path / f"{prover}_public_bad.json"
        bad.write_text(json.dumps([str((int(signals[0]) + 1) % R_MOD)] + signals[1:]))
        assert not groth16_verify(vk, bad, proof), prover
