"""The format readers and writers against real circom / snarkjs output (tests/data_formats/).

Oracles: the JSON exports snarkjs made of the same files (``r1cs export json``,
``wtns export json``, ``zkey export json``), the files' own bytes (our
writers must reproduce them), and the R1CS/QAP relations of the spec
(snarkjs-formats.md 5.3, 5.6) checked with Python ints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuzk_mp.algebra.field import FQ, FR, Q_MOD, R_MOD, limbs_to_ints
from cuzk_mp.formats.binfile import BinFile
from cuzk_mp.formats.r1cs import read_r1cs, write_r1cs
from cuzk_mp.formats.snarkjs_json import (
    proof_from_json, proof_to_json, public_from_json, public_to_json, read_json, vk_from_json, vk_to_json,
)
from cuzk_mp.formats.wtns import read_wtns, wtns_bytes
from cuzk_mp.formats.zkey import coef_matrices, read_zkey, write_zkey

DATA = Path(__file__).parent / "data_formats"
R_INV2 = pow(FR.r, -2, R_MOD)


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def lem_points(arr: np.ndarray) -> list[list[str]]:
    """LEM rows -> snarkjs toObject form: standard-form decimal coordinates, z "1"; zeros -> infinity."""
    out = []
    for row in np.asarray(arr).reshape(-1, arr.shape[-1]):
        if not row.any():
            out.append(None)
            continue
        coords = [str(FQ.from_mont_int(v)) for v in limbs_to_ints(row.reshape(-1, 6))]
        out.append(coords)
    return out  # type: ignore[return-value]


def g1_obj(coords: list[str] | None) -> list[str]:
    return ["0", "1", "0"] if coords is None else [coords[0], coords[1], "1"]


def g2_obj(coords: list[str] | None) -> list[list[str]]:
    if coords is None:
        return [["0", "0"], ["1", "0"], ["0", "0"]]
    return [[coords[0], coords[1]], [coords[2], coords[3]], ["1", "0"]]


def test_r1cs_matches_snarkjs_export() -> None:
    r = read_r1cs(DATA / "mul.r1cs")
    ref = load("mul.r1cs.json")
    assert (r.n_wires, r.n_pub_out, r.n_pub_in, r.n_prv_in, r.n_labels, r.n_constraints) == (
        ref["nVars"], ref["nOutputs"], ref["nPubInputs"], ref["nPrvInputs"], ref["nLabels"], ref["nConstraints"])
    assert r.prime == int(ref["prime"]) == R_MOD
    for i, cons in enumerate(ref["constraints"]):
        for m, mat in enumerate((r.a, r.b, r.c)):
            lo, hi = mat.indptr[i], mat.indptr[i + 1]
            got = {str(int(w)): str(v) for w, v in zip(mat.indices[lo:hi], limbs_to_ints(mat.data[lo:hi]) if hi > lo else [])}
            assert got == cons[m]


def test_r1cs_witness_satisfies_constraints() -> None:
    r = read_r1cs(DATA / "mul.r1cs")
    w = limbs_to_ints(read_wtns(DATA / "mul.wtns"))
    assert w == [int(v) for v in load("mul.wtns.json")]

    def dot(mat: Any, i: int) -> int:
        lo, hi = mat.indptr[i], mat.indptr[i + 1]
        vals = limbs_to_ints(mat.data[lo:hi]) if hi > lo else []
        return sum(v * w[int(k)] for k, v in zip(mat.indices[lo:hi], vals)) % R_MOD

    for i in range(r.n_constraints):
        assert dot(r.a, i) * dot(r.b, i) % R_MOD == dot(r.c, i)


def test_r1cs_writer_reproduces_circom_sections(tmp_path: Path) -> None:
    out = tmp_path / "again.r1cs"
    write_r1cs(out, read_r1cs(DATA / "mul.r1cs"))
    with BinFile.open(DATA / "mul.r1cs", "r1cs", (1,)) as orig, BinFile.open(out, "r1cs", (1,)) as ours:
        assert orig.section_ids == (2, 1, 3) and ours.section_ids == (1, 2, 3)
        for sid in (1, 2, 3):
            assert bytes(ours.section(sid)) == bytes(orig.section(sid))


def test_wtns_bytes_identical_to_snarkjs() -> None:
    w = read_wtns(DATA / "mul.wtns")
    assert wtns_bytes(w) == (DATA / "mul.wtns").read_bytes()


@pytest.mark.parametrize("name", ["mul.zkey", "mul0.zkey"])
def test_zkey_matches_snarkjs_export(name: str) -> None:
    ref = load("mul.zkey.json") if name == "mul.zkey" else None
    with read_zkey(DATA / name) as z:
        assert (z.n8q, z.q, z.n8r, z.r) == (48, Q_MOD, 32, R_MOD)
        assert (z.n_vars, z.n_public, z.domain_size, z.log_domain) == (7, 3, 8, 3)
        assert len(z.contributions) >= 68
        if ref is None:
            return
        assert (z.n_vars, z.n_public, z.domain_size) == (ref["nVars"], ref["nPublic"], ref["domainSize"])
        for ours, theirs in (("alpha1", "vk_alpha_1"), ("beta1", "vk_beta_1"), ("delta1", "vk_delta_1")):
            assert g1_obj(lem_points(getattr(z, ours))[0]) == ref[theirs]
        for ours, theirs in (("beta2", "vk_beta_2"), ("gamma2", "vk_gamma_2"), ("delta2", "vk_delta_2")):
            assert g2_obj(lem_points(getattr(z, ours))[0]) == ref[theirs]
        assert [g1_obj(p) for p in lem_points(z.ic)] == ref["IC"]
        assert [g1_obj(p) for p in lem_points(z.a)] == ref["A"]
        assert [g1_obj(p) for p in lem_points(z.b1)] == ref["B1"]
        assert [g2_obj(p) for p in lem_points(z.b2)] == ref["B2"]
        assert [g1_obj(p) for p in lem_points(z.c)] == ref["C"][z.n_public + 1:]
        assert [g1_obj(p) for p in lem_points(z.h)] == ref["hExps"]
        coefs = [{"matrix": int(e["matrix"]), "constraint": int(e["constraint"]), "signal": int(e["signal"]),
                  "value": str(limbs_to_ints(e["value"])[0] * R_INV2 % R_MOD)} for e in z.coefs]
        assert coefs == ref["ccoefs"]


def test_zkey_coefs_are_the_r1cs_plus_public_rows() -> None:
    """Section 4 = A and B of the r1cs (v R^2), plus A-row nConstraints+s = w[s] for s <= nPublic."""
    r = read_r1cs(DATA / "mul.r1cs")
    with read_zkey(DATA / "mul.zkey") as z:
        za, zb = coef_matrices(z)
        for ours, src, extra in ((za, r.a, True), (zb, r.b, False)):
            for i in range(z.domain_size):
                lo, hi = ours.indptr[i], ours.indptr[i + 1]
                got = sorted(zip(ours.indices[lo:hi].tolist(), [v * R_INV2 % R_MOD for v in limbs_to_ints(ours.data[lo:hi])]
                                 if hi > lo else []))
                if i < r.n_constraints:
                    slo, shi = src.indptr[i], src.indptr[i + 1]
                    want = sorted(zip(src.indices[slo:shi].tolist(), limbs_to_ints(src.data[slo:shi]) if shi > slo else []))
                elif extra and i <= r.n_constraints + r.n_public:
                    want = [(i - r.n_constraints, 1)]
                else:
                    want = []
                assert got == want, (i, extra)


@pytest.mark.parametrize("name", ["mul.zkey", "mul0.zkey"])
def test_zkey_writer_reproduces_snarkjs(tmp_path: Path, name: str) -> None:
    out = tmp_path / "again.zkey"
    with read_zkey(DATA / name) as z:
        write_zkey(out, z)
    with BinFile.open(DATA / name, "zkey", (1,)) as orig, BinFile.open(out, "zkey", (1,)) as ours:
        assert ours.section_ids == tuple(range(1, 11))
        for sid in range(1, 11):
            assert bytes(ours.section(sid)) == bytes(orig.section(sid)), sid
    if name == "mul.zkey":  # written 1..10 by snarkjs: the whole file is identical
        assert out.read_bytes() == (DATA / name).read_bytes()


def test_json_files_roundtrip() -> None:
    proof = read_json(DATA / "proof.json")
    assert proof_to_json(proof_from_json(proof)) == proof
    public = read_json(DATA / "public.json")
    values = public_from_json(public)
    assert values == [int(v) for v in load("mul.wtns.json")[1:4]]
    assert public_to_json(values) == public
    vk_obj = read_json(DATA / "verification_key.json")
    vk = vk_from_json(vk_obj)
    assert vk_to_json(vk) == vk_obj
    with read_zkey(DATA / "mul.zkey") as z:
        assert vk.n_public == z.n_public
        assert g1_obj(lem_points(z.alpha1)[0]) == vk_obj["vk_alpha_1"]
        assert g2_obj(lem_points(z.delta2)[0]) == vk_obj["vk_delta_2"]
        assert [g1_obj(p) for p in lem_points(z.ic)] == vk_obj["IC"]


def test_json_writer_bytes_match_snarkjs(tmp_path: Path) -> None:
    from cuzk_mp.formats.snarkjs_json import write_json
    for name in ("proof.json", "public.json", "verification_key.json"):
        out = tmp_path / name
        write_json(out, read_json(DATA / name))
        assert out.read_bytes() == (DATA / name).read_bytes(), name

