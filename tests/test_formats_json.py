"""Tests for cuzk_mp.formats.snarkjs_json: proof / public / verification-key JSON as snarkjs writes and reads it.

Oracles: the literal shapes of snarkjs 0.7.6 output (snarkjs-formats.md section 7),
Python-int Jacobian coordinates built here, and the bytes bfj writes with ``space: 1``.
"""

from __future__ import annotations

import json
import re
import random
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.algebra.field import G1_GEN, G2_GEN, Q_MOD, R_MOD
from cuzk_mp.errors import FormatError, InputError
from cuzk_mp.formats.snarkjs_json import (
    Proof, VerificationKey, proof_from_json, proof_to_json, public_from_json, public_to_json, read_json,
    vk_from_json, vk_to_json, write_json,
)

SEED = 31337


def fq2_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return ((a[0] * b[0] - a[1] * b[1]) % Q_MOD, (a[0] * b[1] + a[1] * b[0]) % Q_MOD)


def rand_proof(rng: random.Random) -> Proof:
    g1 = lambda: (rng.randrange(Q_MOD), rng.randrange(Q_MOD))  # noqa: E731
    g2 = lambda: ((rng.randrange(Q_MOD), rng.randrange(Q_MOD)), (rng.randrange(Q_MOD), rng.randrange(Q_MOD)))  # noqa: E731
    return Proof(pi_a=g1(), pi_b=g2(), pi_c=g1())


def test_proof_shape_is_snarkjs() -> None:
    (x, y), ((x0, x1), (y0, y1)) = G1_GEN, G2_GEN
    obj = proof_to_json(Proof(pi_a=G1_GEN, pi_b=G2_GEN, pi_c=None))
    assert obj == {
        "pi_a": [str(x), str(y), "1"],
        "pi_b": [[str(x0), str(x1)], [str(y0), str(y1)], ["1", "0"]],
        "pi_c": ["0", "1", "0"],
        "protocol": "groth16", "curve": "bls12381",
    }
    assert list(obj) == ["pi_a", "pi_b", "pi_c", "protocol", "curve"]
    assert proof_to_json(Proof(None, None, None))["pi_b"] == [["0", "0"], ["1", "0"], ["0", "0"]]


def test_proof_roundtrip_through_file(tmp_path: Path) -> None:
    print("seed", SEED)
    rng = random.Random(SEED)
    for p in [rand_proof(rng) for _ in range(5)] + [Proof(None, None, None)]:
        path = tmp_path / "proof.json"
        write_json(path, proof_to_json(p))
        assert proof_from_json(read_json(path), name=str(path)) == p


def test_proof_reader_accepts_snarkjs_variants() -> None:
    rng = random.Random(SEED + 1)
    p = rand_proof(rng)
    assert p.pi_a is not None and p.pi_b is not None and p.pi_c is not None
    z = rng.randrange(2, Q_MOD)
    z2 = (rng.randrange(Q_MOD), rng.randrange(1, Q_MOD))
    jac_a = [p.pi_a[0] * z**2 % Q_MOD, p.pi_a[1] * z**3 % Q_MOD, z]
    zz = fq2_mul(z2, z2)
    jac_b = [list(fq2_mul(p.pi_b[0], zz)), list(fq2_mul(p.pi_b[1], fq2_mul(zz, z2))), list(z2)]
    obj: dict[str, Any] = {
        "pi_a": [str(v) for v in jac_a],
        "pi_b": [[str(c) for c in e] for e in jac_b],
        "pi_c": [str(p.pi_c[0]), str(p.pi_c[1])],  # 2-element affine
    }
    assert proof_from_json(obj) == p
    obj["pi_c"] = [p.pi_c[0], p.pi_c[1], 1]  # JSON integers, as BigInt() would take them
    assert proof_from_json(obj) == p
    obj["pi_c"] = [hex(p.pi_c[0]), "0x" + format(p.pi_c[1], "X"), "0x1"]  # hex, as unstringifyBigInts takes it
    assert proof_from_json(obj) == p
    obj["pi_a"] = ["5", "7", "0"]  # z = 0 is infinity whatever x, y
    obj["pi_b"] = [["1", "2"], ["3", "4"], ["0", "0"]]
    assert proof_from_json(obj) == Proof(None, None, p.pi_c)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda o: o["pi_b"][1].__setitem__(0, "0X12"), r"proof\.json: pi_b\[1\]\[0\]: not a decimal or 0x hex string: '0X12'"),
    (lambda o: o["pi_b"][1].__setitem__(0, "0x"), r"pi_b\[1\]\[0\]: not a decimal or 0x hex string: '0x'"),
    (lambda o: o["pi_b"][1].__setitem__(0, "0x" + "f" * 201), r"pi_b\[1\]\[0\]: not a decimal or 0x hex string"),
    (lambda o: o["pi_c"].__setitem__(0, hex(Q_MOD)), r"pi_c\[0\]: \d+ is not < q"),
    (lambda o: o["pi_a"].__setitem__(0, "-1"), r"proof\.json: pi_a\[0\]: -1 is negative"),
    (lambda o: o["pi_a"].__setitem__(1, " 1"), r"pi_a\[1\]: not a decimal or 0x hex string"),
    (lambda o: o["pi_a"].__setitem__(1, "1.0"), r"pi_a\[1\]: not a decimal or 0x hex string"),
    (lambda o: o["pi_a"].__setitem__(1, "\u0661"), r"pi_a\[1\]: not a decimal or 0x hex string"),
    (lambda o: o["pi_a"].__setitem__(1, ""), r"pi_a\[1\]: not a decimal or 0x hex string"),
    (lambda o: o["pi_a"].__setitem__(1, 1.0), r"pi_a\[1\]: not a decimal or 0x hex string \(float\)"),
    (lambda o: o["pi_a"].__setitem__(1, True), r"pi_a\[1\]: not a decimal or 0x hex string \(bool\)"),
    (lambda o: o["pi_a"].__setitem__(1, None), r"pi_a\[1\]: not a decimal or 0x hex string \(NoneType\)"),
    (lambda o: o["pi_c"].__setitem__(2, str(Q_MOD)), r"pi_c\[2\]: \d+ is not < q"),
    (lambda o: o["pi_b"][0].__setitem__(1, str(Q_MOD + 5)), r"pi_b\[0\]\[1\]: \d+ is not < q"),
    (lambda o: o["pi_a"].__setitem__(0, -3), r"pi_a\[0\]: -3 is negative"),
    (lambda o: o["pi_a"].append("1"), r"pi_a: expected 2 or 3 elements, got 4"),
    (lambda o: o["pi_b"].__setitem__(2, ["1"]), r"pi_b\[2\]: expected 2 elements, got 1"),
    (lambda o: o.__setitem__("pi_c", "1"), r"pi_c: expected an array, got str"),
    (lambda o: o.pop("pi_b"), r"pi_b: missing"),
    (lambda o: o.__setitem__("curve", "bn128"), r"curve: is 'bn128', expected 'bls12381'"),
    (lambda o: o.__setitem__("protocol", "plonk"), r"protocol: is 'plonk', expected 'groth16'"),
])
def test_proof_reader_errors(mutate: Any, message: str) -> None:
    obj = proof_to_json(rand_proof(random.Random(SEED + 2)))
    mutate(obj)
    with pytest.raises(FormatError, match=message):
        proof_from_json(obj)


def test_proof_reader_rejects_non_objects() -> None:
    with pytest.raises(FormatError, match=r"p\.json: top level: expected an object, got str"):
        proof_from_json("proof", name="p.json")
    with pytest.raises(FormatError, match=r"p\.json: public signals, not a proof"):  # an array is public.json's
        proof_from_json([], name="p.json")


def test_public_signals() -> None:
    vals = [0, 1, 33, R_MOD - 1]
    assert public_to_json(vals) == ["0", "1", "33", str(R_MOD - 1)]
    assert public_from_json(public_to_json(vals), name="public.json") == vals
    assert public_from_json([]) == []
    # out of [0, r): read as given, for the verifier's "invalid" (snarkjs: "Public inputs are not valid")
    assert public_from_json(["1", str(R_MOD), "-1", hex(R_MOD + 5)]) == [1, R_MOD, -1, R_MOD + 5]
    with pytest.raises(FormatError, match=r"pub\.json: \[0\]: not a decimal or 0x hex string: '--1'"):
        public_from_json(["--1"], name="pub.json")
    with pytest.raises(FormatError, match=r"pub\.json: \[0\]: not a decimal or 0x hex string"):
        public_from_json(["abc"], name="pub.json")
    with pytest.raises(FormatError, match=r"pub\.json: top level: expected an array, got dict"):
        public_from_json({}, name="pub.json")


def rand_vk(rng: random.Random, n_public: int, with_ab: bool = True) -> VerificationKey:
    p = rand_proof(rng)
    ab = [[[rng.randrange(Q_MOD), rng.randrange(Q_MOD)] for _ in range(3)] for _ in range(2)] if with_ab else None
    return VerificationKey(n_public=n_public, alpha1=p.pi_a, beta2=p.pi_b, gamma2=G2_GEN, delta2=None,
                           ic=[rand_proof(rng).pi_a for _ in range(n_public)] + [None], alphabeta_12=ab)


def test_vk_roundtrip_and_shape(tmp_path: Path) -> None:
    rng = random.Random(SEED + 3)
    for n_public, with_ab in ((0, True), (3, True), (2, False)):
        vk = rand_vk(rng, n_public, with_ab)
        obj = vk_to_json(vk)
        keys = ["protocol", "curve", "nPublic", "vk_alpha_1", "vk_beta_2", "vk_gamma_2", "vk_delta_2"]
        assert list(obj) == keys + (["vk_alphabeta_12"] if with_ab else []) + ["IC"]
        assert obj["nPublic"] == n_public and len(obj["IC"]) == n_public + 1
        path = tmp_path / "verification_key.json"
        write_json(path, obj)
        assert vk_from_json(read_json(path)) == vk
    vk = rand_vk(rng, 1)
    assert vk.alphabeta_12 is not None
    as_strings = VerificationKey(**{**vk.__dict__, "alphabeta_12": [[[str(c) for c in e] for e in h] for h in vk.alphabeta_12]})
    assert vk_to_json(as_strings) == vk_to_json(vk)


def test_vk_errors() -> None:
    obj = vk_to_json(rand_vk(random.Random(SEED + 4), 2))
    cases = [
        ({"IC": obj["IC"][:2]}, r"vk\.json: IC: expected 3 elements, got 2"),
        ({"nPublic": "2"}, r"vk\.json: nPublic: expected a non-negative integer, got '2'"),
        ({"vk_alphabeta_12": obj["vk_alphabeta_12"][:1]}, r"vk_alphabeta_12: expected 2 elements"),
        ({"vk_alphabeta_12": [obj["vk_alphabeta_12"][0], [["1", "x"], ["1", "2"], ["3", "4"]]]},
         r"vk_alphabeta_12\[1\]\[0\]\[1\]: not a decimal or 0x hex string"),
        ({"vk_delta_2": [["1", "2"], ["3", "4"], ["1", "0"], ["0", "0"]]}, r"vk_delta_2: expected 2 or 3 elements, got 4"),
        ({"curve": "bn128"}, r"vk\.json: curve: is 'bn128'"),
    ]
    for change, message in cases:
        with pytest.raises(FormatError, match=message):
            vk_from_json({**obj, **change}, name="vk.json")
    with pytest.raises(FormatError, match=r"vk\.json: vk_beta_2: missing"):
        vk_from_json({k: v for k, v in obj.items() if k != "vk_beta_2"}, name="vk.json")
    plonk = {"protocol": "plonk", "curve": "bls12381", "nPublic": 1, "power": 3, "Qm": ["1", "2", "1"]}
    with pytest.raises(FormatError, match=r"vk\.json: protocol: is 'plonk', expected 'groth16'"):
        vk_from_json(plonk, name="vk.json")  # named by its protocol, not by a groth16 key it lacks
    with pytest.raises(ValueError, match="2 IC points for nPublic 2"):
        vk_to_json(VerificationKey(2, None, None, None, None, [None, None], None))


def test_write_json_is_bfj_space_1(tmp_path: Path) -> None:
    path = tmp_path / "proof.json"
    write_json(path, {"pi_a": ["1", "2", "1"], "pi_b": [["1", "2"], ["3", "4"]], "protocol": "groth16"})
    # The bytes `bfj.write(file, obj, {space: 1})` produced for the same object under snarkjs 0.7.6.
    expected = ('{\n "pi_a": [\n  "1",\n  "2",\n  "1"\n ],\n "pi_b": [\n  [\n   "1",\n   "2"\n  ],\n'
                '  [\n   "3",\n   "4"\n  ]\n ],\n "protocol": "groth16"\n}')
    assert path.read_text() == expected
    assert not list(tmp_path.glob(".cuzk-mp-*"))  # no temporary left


def test_read_json_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing.json: cannot read"):
        read_json(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"pi_a": [1, 2,\n')
    with pytest.raises(FormatError, match=r"broken\.json: not valid JSON: .* at line 2"):
        read_json(broken)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(FormatError, match=r"bin\.json: not UTF-8 text"):
        read_json(binary)
    good = tmp_path / "ok.json"
    good.write_text(json.dumps(["1"]))
    assert read_json(good) == ["1"]
    good.write_text(f"[1, {2**53}, {2**60}]")  # JSON integers a JavaScript double holds exactly
    assert read_json(good) == [1, 2**53, 2**60]
    inexact = tmp_path / "inexact.json"  # snarkjs's JSON.parse would round it: another value
    inexact.write_text(f"[{R_MOD - 1}]")
    with pytest.raises(InputError, match=rf'inexact\.json: JSON number {R_MOD - 1} is not exact as a JavaScript '
                       rf'number .*write it as a decimal string: "{R_MOD - 1}"'):
        read_json(inexact)


def test_a_document_given_in_anothers_place_is_named_for_what_it_is(tmp_path: Path) -> None:
    """The usual slip (``groth16 verify VK PROOF PUBLIC``, a key where a JSON file goes) is named as
    what the file is, not only as the first thing that does not fit."""
    proof = proof_to_json(rand_proof(random.Random(SEED + 5)))
    vk = vk_to_json(rand_vk(random.Random(SEED + 6), 1))
    with pytest.raises(FormatError, match=r"proof\.json: a proof, not public signals \(are the files in the "
                                          r"right order\?\)"):
        public_from_json(proof, name="proof.json")
    with pytest.raises(FormatError, match=r"public\.json: public signals, not a proof"):
        proof_from_json(["1"], name="public.json")
    with pytest.raises(FormatError, match=r"proof\.json: a proof, not a verification key"):
        vk_from_json(proof, name="proof.json")
    with pytest.raises(FormatError, match=r"vk\.json: a verification key, not a proof"):
        proof_from_json(vk, name="vk.json")
    for magic, kind in ((b"zkey", "a .zkey file"), (b"wtns", "a .wtns file"), (b"r1cs", "a .r1cs file"),
                        (b"\0asm", "a .wasm file")):
        path = tmp_path / "in.json"
        path.write_bytes(magic + b"\x01\x00\x00\x00\xff\xfe")
        with pytest.raises(FormatError, match=rf"in\.json: not JSON text but {re.escape(kind)}"):
            read_json(path)
