"""Tests of the PoRep-shaped synthetic circuit (cuzk_mp.circuits.synthetic).

Oracles: the constraint check A.w o B.w == C.w done two independent ways (the numba CSR
mat-vec on Montgomery forms at 2^10..2^14, and plain Python ints row by row at 2^10), the
circuit's own definition re-derived from the witness with Python ints (digest = sum of lane
outputs, partition bits), ``snarkjs wtns check`` on the written .r1cs/.wtns files, and a snarkjs
Groth16 proof at 2^10 that verifies, and fails with a wrong public input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.field import R_MOD, domain_log_size, limbs_to_ints
from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.circuits.synthetic_kinds import write_synthetic
from cuzk_mp.errors import ConfigError, InputError
from cuzk_mp.formats.r1cs import R1CS, read_r1cs
from cuzk_mp.formats.wtns import read_wtns, write_wtns
from tests.oracle import oracle  # noqa: F401 - the session fixture
from tests.oracle import Oracle, export_vk, groth16_prove, groth16_setup, groth16_verify, require_tools, wtns_check

SEED = 20261130


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    print(f"test_synthetic seed {SEED}")
    return np.random.default_rng(SEED)


def failing_rows(r1cs: R1CS, w: np.ndarray) -> np.ndarray:
    """Rows where <A_i,w> <B_i,w> != <C_i,w>, on Montgomery forms (coef R * w R / R = coef w R)."""
    wm = fr.to_mont(w)
    a, b, c = (fr.csr_matvec(m.indptr, m.indices, fr.to_mont(m.data), wm) for m in (r1cs.a, r1cs.b, r1cs.c))
    return np.flatnonzero((fr.mul(a, b) != c).any(axis=1))


def python_failing_rows(r1cs: R1CS, w: np.ndarray) -> list[int]:
    """The same check with Python ints, row by row (independent of every numba kernel)."""
    wi = limbs_to_ints(w)
    mats = [(m.indptr, m.indices, limbs_to_ints(m.data)) for m in (r1cs.a, r1cs.b, r1cs.c)]

    def dot(m: tuple[np.ndarray, np.ndarray, list[int]], i: int) -> int:
        ptr, idx, data = m
        return sum(data[k] * wi[idx[k]] for k in range(ptr[i], ptr[i + 1])) % R_MOD

    return [i for i in range(r1cs.n_constraints) if dot(mats[0], i) * dot(mats[1], i) % R_MOD != dot(mats[2], i)]


def binary(w: np.ndarray) -> np.ndarray:
    """Mask of witness values that are 0 or 1."""
    return (w[:, 1:] == 0).all(axis=1) & (w[:, 0] <= 1)


@pytest.mark.parametrize("log_n", [10, 11, 12, 13, 14])
@pytest.mark.parametrize("n_public", [1, 4, 9])
def test_domain_is_exactly_2k_and_no_row_is_empty(log_n: int, n_public: int) -> None:
    c = PorepLike(log_n, n_public)
    r = c.r1cs()
    assert r.n_constraints == c.n_constraints == (1 << log_n) - n_public - 1
    assert domain_log_size(r.n_constraints + r.n_public + 1) == log_n
    assert r.n_constraints + r.n_public + 1 == c.domain_size == 1 << log_n
    assert (r.n_wires, r.n_pub_out, r.n_pub_in, r.n_public) == (c.n_wires, n_public - 1, 1, n_public)
    for m in (r.a, r.b, r.c):
        assert m.n_rows == r.n_constraints and m.n_cols == r.n_wires
        assert int(m.indices.max()) < r.n_wires
        assert np.all(np.diff(m.indptr) >= 0)
    # every row constrains something: A and B are never empty (C is empty for booleanity rows)
    assert np.all(np.diff(r.a.indptr) > 0) and np.all(np.diff(r.b.indptr) > 0)
    # every wire but the constant appears in some constraint
    used = np.zeros(r.n_wires, dtype=bool)
    for m in (r.a, r.b, r.c):
        used[m.indices] = True
    assert used.all()


@pytest.mark.parametrize("log_n", [10, 11, 12, 13, 14])
def test_witness_satisfies_every_constraint(log_n: int, rng: np.random.Generator) -> None:
    c = PorepLike(log_n)
    for _ in range(2):
        seed, partition = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32))
        w = c.witness(seed, partition)
        assert w.shape == (c.n_wires, 4) and w.dtype == np.uint64
        assert fr.first_noncanonical(w) == -1
        assert failing_rows(c.r1cs(), w).size == 0, (seed, partition)


def test_python_int_oracle_agrees() -> None:
    c = PorepLike(10)
    w = c.witness(7, 3)
    assert python_failing_rows(c.r1cs(), w) == []
    bad = w.copy()
    bad[c.lane_base + 128, 0] ^= 1  # lane 0's first XOR output (an input bit flipped would still be boolean)
    assert python_failing_rows(c.r1cs(), bad) == failing_rows(c.r1cs(), bad).tolist() != []


def test_deterministic_and_witness_into() -> None:
    a, b = PorepLike(12), PorepLike(12)
    w = a.witness(5, 9)
    assert np.array_equal(w, b.witness(5, 9))
    buf = np.full((b.n_wires + 10, 4), 0xDEADBEEF, dtype=np.uint64)  # garbage, and a view into a larger buffer
    b.witness_into(5, 9, buf[3 : 3 + b.n_wires])
    assert np.array_equal(buf[3 : 3 + b.n_wires], w)
    assert np.all(buf[:3] == 0xDEADBEEF) and np.all(buf[3 + b.n_wires :] == 0xDEADBEEF)
    assert a.r1cs() is a.r1cs()
    for m in "abc":
        ma, mb = getattr(a.r1cs(), m), getattr(b.r1cs(), m)
        assert np.array_equal(ma.indptr, mb.indptr) and np.array_equal(ma.indices, mb.indices)
        assert np.array_equal(ma.data, mb.data)


@pytest.mark.parametrize("log_n", [13, 16])
def test_witness_into_same_bytes_for_any_thread_count(log_n: int) -> None:
    c = PorepLike(log_n)
    assert c.partial_rows > 0 and c.n_lanes > 4  # whole lanes and a truncated one
    ref = c.witness(11, 12)
    for threads in (1, 2, 64):  # 64: more than the pool, clamped
        buf = np.full((c.n_wires, 4), 0x5A5A, dtype=np.uint64)  # every wire must be written
        c.witness_into(11, 12, buf, threads=threads)
        assert np.array_equal(buf, ref), threads
    assert failing_rows(c.r1cs(), ref).size == 0


def test_partitions_and_seeds_give_different_witnesses() -> None:
    c = PorepLike(11)
    w00, w01, w10 = c.witness(0, 0), c.witness(0, 1), c.witness(1, 0)
    pub = [c.public_inputs(0, 0), c.public_inputs(0, 1), c.public_inputs(1, 0)]
    for x, y in ((w00, w01), (w00, w10), (w01, w10)):
        # most private wires differ somewhere in every lane, not just the public ones
        assert np.count_nonzero((x != y).any(axis=1)) > c.n_wires // 4
    assert len({tuple(p) for p in pub}) == 3
    assert [p[-1] for p in pub] == [0, 1, 0]
    assert len({p[0] for p in pub}) == 3  # the digest depends on seed and partition


@pytest.mark.parametrize("log_n", [12, 14])
def test_about_80_percent_of_values_are_bits(log_n: int) -> None:
    c = PorepLike(log_n)
    w = c.witness(SEED, 2)
    ones = binary(w) & (w[:, 0] == 1)
    zeros = binary(w) & (w[:, 0] == 0)
    frac = binary(w).mean()
    print(f"2^{log_n}: 0/1 fraction {frac:.4f} (zeros {zeros.mean():.4f}, ones {ones.mean():.4f})")
    assert 0.75 <= frac <= 0.85
    assert 0.3 <= zeros.mean() <= 0.55 and 0.25 <= ones.mean() <= 0.5
    # the rest are mostly full-size field elements (S-box wires), not small integers
    big = ~binary(w) & (w[:, 3] != 0)
    assert big.sum() > 0.6 * (~binary(w)).sum()


@pytest.mark.parametrize("n_public", [1, 2, 4, 9])
def test_wire_order_and_public_signals(n_public: int) -> None:
    c = PorepLike(13, n_public)
    seed, partition = 11, 0xA5C3F00D
    w = c.witness(seed, partition)
    wi = limbs_to_ints(w[: c.lane_base])
    pub = c.public_inputs(seed, partition)
    assert wi[0] == 1
    assert pub == wi[1 : 1 + n_public]
    assert pub[-1] == partition == wi[c.partition_wire]  # the only public input, after the outputs
    assert wi[c.prologue_base : c.prologue_base + 32] == [(partition >> i) & 1 for i in range(32)]
    first, end = c.lane_base + c.lane_out_offset, c.lane_base + c.n_lanes * c.lane_width
    lane_outs = limbs_to_ints(w[first:end:c.lane_width])
    expected = [sum(lane_outs) % R_MOD] + [lane_outs[(j - 1) % c.n_lanes] for j in range(1, n_public - 1)]
    assert pub[:-1] == expected[: n_public - 1]
    assert all(x >= 1 << 64 for x in lane_outs)  # full-size field elements


def test_broken_witnesses_are_caught(rng: np.random.Generator) -> None:
    c = PorepLike(11)
    r = c.r1cs()
    w = c.witness(3, 4)
    bits = np.flatnonzero(binary(w))
    # every bit of a whole lane is read by some gadget (in the truncated lane, some inputs are not)
    bits = bits[(bits > c.n_public) & (bits < c.lane_base + c.n_lanes * c.lane_width)]
    for wire in rng.choice(bits, 5, replace=False):
        bad = w.copy()
        bad[wire, 0] ^= 1
        assert failing_rows(r, bad).size > 0, wire
    for wire in range(1, c.n_public + 1):  # each public signal is bound by a constraint
        bad = w.copy()
        bad[wire] = fr.from_ints([limbs_to_ints(w[wire])[0] + 1], mont=False)
        assert failing_rows(r, bad).size > 0, wire


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="log_n"):
        PorepLike(9)
    with pytest.raises(ConfigError, match="n_public"):
        PorepLike(12, 0)
    with pytest.raises(ConfigError, match="lane"):
        PorepLike(10, 100)
    c = PorepLike(10)
    with pytest.raises(InputError, match="partition"):
        c.witness(0, 1 << 32)
    with pytest.raises(InputError, match="partition"):
        c.public_inputs(0, -1)
    with pytest.raises(InputError, match="seed"):
        c.witness(-1, 0)
    with pytest.raises(InputError, match=r"\(1016, 4\) uint64"):
        c.witness_into(0, 0, np.zeros((c.n_wires, 4), dtype=np.int64))
    with pytest.raises(InputError, match=r"\(1016, 4\) uint64"):
        c.witness_into(0, 0, np.zeros((c.n_wires - 1, 4), dtype=np.uint64))


def test_write_synthetic_reads_back(tmp_path: Path) -> None:
    r1cs_path, wtns_path = write_synthetic("porep-like", 10, tmp_path / "out", seed=4, partition=6)
    assert (r1cs_path.name, wtns_path.name) == ("porep-like-10.r1cs", "porep-like-10.wtns")
    c = PorepLike(10)
    back, w = read_r1cs(r1cs_path), read_wtns(wtns_path)
    assert np.array_equal(w, c.witness(4, 6))
    ref = c.r1cs()
    assert (back.n_wires, back.n_pub_out, back.n_pub_in, back.n_constraints) == (
        ref.n_wires, ref.n_pub_out, ref.n_pub_in, ref.n_constraints)
    for m in "abc":
        mb, mr = getattr(back, m), getattr(ref, m)
        assert np.array_equal(mb.indptr, mr.indptr) and np.array_equal(mb.indices, mr.indices)
        assert np.array_equal(mb.data, mr.data)


@pytest.mark.snarkjs
def test_snarkjs_wtns_check_accepts_and_rejects(tmp_path: Path) -> None:
    require_tools()
    r1cs_path, wtns_path = write_synthetic("porep-like", 10, tmp_path, seed=1, partition=2)
    assert wtns_check(r1cs_path, wtns_path)
    w = read_wtns(wtns_path)
    c = PorepLike(10)
    w[c.lane_base + 40, 0] ^= 1  # an input bit of lane 0: still boolean, but the XOR/Ch/Maj rows reading it fail
    broken = tmp_path / "broken.wtns"
    write_wtns(broken, w)
    assert not wtns_check(r1cs_path, broken)


@pytest.mark.snarkjs
def test_snarkjs_proof_verifies_and_a_wrong_public_input_fails(tmp_path: Path, oracle: Oracle) -> None:
    """At 2^10 the circuit fits the oracle's 2^10 ptau exactly (a full domain)."""
    r1cs_path, wtns_path = write_synthetic("porep-like", 10, tmp_path, seed=3, partition=5)
    zkey = groth16_setup(r1cs_path, oracle.ptau(), tmp_path / "k.zkey")
    vk = export_vk(zkey, tmp_path / "vk.json")
    proof, public = tmp_path / "proof.json", tmp_path / "public.json"
    groth16_prove(zkey, wtns_path, proof, public)
    signals = json.loads(public.read_text())
    assert [int(x) for x in signals] == PorepLike(10).public_inputs(3, 5)
    assert groth16_verify(vk, public, proof)
    for i, wrong in ((3, "6"), (0, str((int(signals[0]) + 1) % R_MOD))):  # the partition; the digest
        bad = tmp_path / f"public_bad{i}.json"
        bad.write_text(json.dumps(signals[:i] + [wrong] + signals[i + 1 :]))
        assert not groth16_verify(vk, bad, proof)
