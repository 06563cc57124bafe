"""cuzk-mp and snarkjs accept each other's Groth16 artifacts (BLS12-381).

For each snarkjs-keyed test circuit (tests/oracle.py: snarkjs ``groth16 setup`` + one ``zkey
contribute`` on a 2^10 powers of tau): our proof passes ``snarkjs groth16 verify``; snarkjs's
proof passes ``cuzk-mp groth16 verify``; a proof with pi_a, pi_b or pi_c replaced by another
valid point (its negation: on the curve and in the subgroup) and a changed public input fail
both; ``cuzk-mp zkey export verificationkey`` writes what snarkjs writes; and the zkey of
``cuzk-mp setup`` (development setup) works with ``snarkjs groth16 prove`` / ``verify``.
The SHA-256 circuit (2^15 rows, too large for a quick snarkjs ptau) is keyed by ``cuzk-mp
setup`` only. The same checks run on odd but valid shapes (tests/oracle.py ``SHAPE_CIRCUITS``): no
public signal, only public signals, wires in no constraint and constraints with empty A and B (its
key after three contributions and a beacon), domains on, below and above a power of two.
Everything runs through the CLIs, as a user would.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuzk_mp.algebra.field import Q_MOD, R_MOD
from tests.oracle import (
    ALL_CIRCUITS, BEACON_HASH, SHAPE_CIRCUITS, SNARKJS_CIRCUITS, CircuitFiles, Oracle, cuzk, export_vk, groth16_prove,
    groth16_verify, groth16_verify_many, write_json,
)
from tests.oracle import oracle  # noqa: F401  (the session fixture, for pytest to find)

pytestmark = pytest.mark.snarkjs
SEED = 20261130


@dataclass
class Case:
    """One circuit with a witness, and the proofs made of it (built lazily, once)."""

    name: str
    files: CircuitFiles
    zkey: Path
    vk: Path
    folder: Path
    _made: dict[str, tuple[dict, list]] = field(default_factory=dict)

    @property
    def wtns(self) -> Path:
        """A witness for a random valid input, from ``cuzk-mp wtns calculate``."""
        path = self.folder / "witness.wtns"
        if not path.exists():
            rng = random.Random(f"{SEED}-{self.name}")
            print(f"seed {SEED}-{self.name}")
            inputs = write_json(self.folder / "input.json", ALL_CIRCUITS[self.name].sample_input(rng))
            _ok(cuzk("wtns", "calculate", self.files.wasm, inputs, path))
        return path

    def proof(self, prover: str) -> tuple[dict, list]:
        """(proof, public signals) as JSON values, made by ``prover`` (snarkjs or cuzk)."""
        if prover not in self._made:
            proof, public = self.folder / f"{prover}_proof.json", self.folder / f"{prover}_public.json"
            if prover == "snarkjs":
                groth16_prove(self.zkey, self.wtns, proof, public)
            else:
                _ok(cuzk("groth16", "prove", self.zkey, self.wtns, proof, public))
            self._made[prover] = (json.loads(proof.read_text()), json.loads(public.read_text()))
        return self._made[prover]


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{proc.args}:\n{proc.stderr}"


def _cuzk_verifies(vk: Path, proof: dict, public: list, folder: Path, tag: str) -> bool:
    """``cuzk-mp groth16 verify``: True on exit 0 + OK!, False on exit 1; anything else fails."""
    p, s = write_json(folder / f"{tag}_proof.json", proof), write_json(folder / f"{tag}_pub.json", public)
    proc = cuzk("groth16", "verify", vk, s, p)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0 and "OK!" in proc.stdout


def _negate(proof: dict, key: str) -> dict:
    """The proof with one point replaced by its negation (another valid point)."""
    bad = copy.deepcopy(proof)
    if key == "pi_b":
        bad[key][1] = [str(-int(c) % Q_MOD) for c in bad[key][1]]
    else:
        bad[key][1] = str(-int(bad[key][1]) % Q_MOD)
    return bad


@pytest.fixture(scope="module", params=[*SNARKJS_CIRCUITS, *SHAPE_CIRCUITS])
def case(request: pytest.FixtureRequest, oracle: Oracle,  # noqa: F811
         tmp_path_factory: pytest.TempPathFactory) -> Case:
    name = request.param
    key = oracle.snarkjs_key(name)
    return Case(name, oracle.circuit(name), key.zkey, key.vk, tmp_path_factory.mktemp(name))


def test_our_proof_passes_snarkjs_verify(case: Case) -> None:
    proof, public = case.proof("cuzk")
    assert public == case.proof("snarkjs")[1]  # same witness, same public signals
    assert proof["protocol"] == "groth16" and proof["curve"] == "bls12381"
    assert groth16_verify(case.vk, case.folder / "cuzk_public.json", case.folder / "cuzk_proof.json")


def test_snarkjs_proof_passes_cuzk_verify(case: Case) -> None:
    proof, public = case.proof("snarkjs")
    assert _cuzk_verifies(case.vk, proof, public, case.folder, "snarkjs_again")


def _bumped(public: list, i: int) -> list:
    """The public signals with signal ``i`` plus one."""
    bumped = list(public)
    bumped[i] = str((int(bumped[i]) + 1) % R_MOD)
    return bumped


def test_tampered_proofs_fail_both_verifiers(case: Case) -> None:
    proof, public = case.proof("snarkjs")
    variants = {key: (public, _negate(proof, key)) for key in ("pi_a", "pi_b", "pi_c")}
    if public:  # the first and the last signal (unused_wires: its public input in no constraint)
        variants["public_first"] = (_bumped(public, 0), proof)
    if len(public) > 1:
        variants["public_last"] = (_bumped(public, -1), proof)
    # Control first: the untampered proof must pass, or the failures below prove nothing.
    verdicts = groth16_verify_many(case.vk, [(public, proof), *variants.values()])
    assert verdicts == [True] + [False] * len(variants), dict(zip(["none", *variants], verdicts))
    for tag, (pub, prf) in variants.items():
        assert not _cuzk_verifies(case.vk, prf, pub, case.folder, tag), tag


def test_vk_export_equals_snarkjs(case: Case) -> None:
    ours = case.folder / "cuzk_vk.json"
    _ok(cuzk("zkey", "export", "verificationkey", case.zkey, ours))
    assert json.loads(ours.read_text()) == json.loads(case.vk.read_text())


def test_dev_setup_zkey_works_with_snarkjs(case: Case) -> None:
    dev_zkey, vk = case.folder / "dev.zkey", case.folder / "dev_vk.json"
    _ok(cuzk("setup", case.files.r1cs, dev_zkey))
    export_vk(dev_zkey, vk)
    ours = case.folder / "dev_vk_cuzk.json"
    _ok(cuzk("zkey", "export", "verificationkey", dev_zkey, ours))
    assert json.loads(ours.read_text()) == json.loads(vk.read_text())
    made: dict[str, tuple[list, dict]] = {}  # prover -> (public signals, proof)
    for prover in ("snarkjs", "cuzk"):
        proof, public = case.folder / f"dev_{prover}_proof.json", case.folder / f"dev_{prover}_public.json"
        if prover == "snarkjs":
            groth16_prove(dev_zkey, case.wtns, proof, public)
        else:
            _ok(cuzk("groth16", "prove", dev_zkey, case.wtns, proof, public))
        made[prover] = (json.loads(public.read_text()), json.loads(proof.read_text()))
    assert _cuzk_verifies(vk, made["snarkjs"][1], made["snarkjs"][0], case.folder, "dev_snarkjs")
    assert groth16_verify_many(vk, [made["snarkjs"], made["cuzk"]]) == [True, True]  # one node process


def test_shape_circuits_have_their_shape(oracle: Oracle) -> None:  # noqa: F811
    """What each shape circuit is about holds in what circom and snarkjs made of it (a newer circom that
    simplified a shape away would leave its interop tests proving nothing new)."""
    import numpy as np

    from cuzk_mp.formats.r1cs import read_r1cs
    from cuzk_mp.formats.zkey import read_zkey

    shapes = {}
    for name in SHAPE_CIRCUITS:
        r1cs, zkey = read_r1cs(oracle.circuit(name).r1cs), read_zkey(oracle.snarkjs_key(name).zkey)
        assert (zkey.n_public, zkey.n_vars) == (r1cs.n_public, r1cs.n_wires)
        mats = (r1cs.a, r1cs.b, r1cs.c)
        used = set(np.concatenate([m.indices for m in mats]).tolist())
        shapes[name] = {
            "rows": r1cs.n_constraints + r1cs.n_public + 1, "domain": zkey.domain_size, "public": r1cs.n_public,
            "private": r1cs.n_wires - r1cs.n_public - 1, "unused": sorted(set(range(1, r1cs.n_wires)) - used),
            "empty_a_b": int(np.sum((np.diff(r1cs.a.indptr) == 0) & (np.diff(r1cs.b.indptr) == 0))),
            "contributions": int.from_bytes(zkey.contributions[64:68], "little"),
            "beacon": bytes.fromhex(BEACON_HASH) in zkey.contributions,
        }
    one = {"unused": [], "empty_a_b": 0, "contributions": 1, "beacon": False}
    assert shapes == {
        "no_public": {"rows": 2, "domain": 2, "public": 0, "private": 3, **one},
        "public_only": {"rows": 31, "domain": 32, "public": 20, "private": 0, **one},
        # wires: 1, s, m, p | a, b, q, free, t, u, v: p, q and free are in no constraint
        "unused_wires": {"rows": 9, "domain": 16, "public": 3, "private": 7, "unused": [3, 6, 7],
                         "empty_a_b": 2, "contributions": 4, "beacon": True},
    }


@pytest.mark.slow
def test_sha256_with_dev_setup_both_ways(oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    """The ~30k-constraint circuit: cuzk-mp setup, proofs both ways, digest = hashlib's."""
    files = oracle.circuit("sha256_block")
    msg = b"cuzk-mp proves what snarkjs proves, on BLS12-381!!!!!!"[:55].ljust(55, b".")
    inputs = write_json(tmp_path / "input.json", {"msg": list(msg)})
    wtns, zkey, vk = tmp_path / "w.wtns", tmp_path / "dev.zkey", tmp_path / "vk.json"
    _ok(cuzk("wtns", "calculate", files.wasm, inputs, wtns))
    _ok(cuzk("setup", files.r1cs, zkey))
    export_vk(zkey, vk)
    for prover in ("snarkjs", "cuzk"):
        proof, public = tmp_path / f"{prover}_proof.json", tmp_path / f"{prover}_public.json"
        if prover == "snarkjs":
            groth16_prove(zkey, wtns, proof, public)
        else:
            _ok(cuzk("groth16", "prove", zkey, wtns, proof, public))
        assert groth16_verify(vk, public, proof), prover
        assert _cuzk_verifies(vk, json.loads(proof.read_text()), json.loads(public.read_text()),
                              tmp_path, f"{prover}_again"), prover
        hi, lo = map(int, json.loads(public.read_text()))
        assert ((hi << 128) | lo).to_bytes(32, "big") == hashlib.sha256(msg).digest()
