"""Tests for cuzk_mp.formats.r1cs: read/write of circom .r1cs files.

Oracle: a plain-Python encoder written here from the spec
(snarkjs-formats.md 5.3), and the random Python-int constraint systems it encodes.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_mp.algebra.field import R_MOD, ints_to_limbs, limbs_to_ints
from cuzk_mp.algebra.sparse import CsrMatrix
from cuzk_mp.errors import FormatError
from cuzk_mp.formats.r1cs import R1CS, read_r1cs, write_r1cs

SEED = 5150
LC = list[tuple[int, int]]  # (wire, coefficient) terms
Constraint = tuple[LC, LC, LC]


def enc_lc(lc: LC, n8: int = 32) -> bytes:
    return struct.pack("<I", len(lc)) + b"".join(struct.pack("<I", w) + c.to_bytes(n8, "little") for w, c in lc)


def header(n_wires: int, counts: tuple[int, int, int], n_constraints: int, prime: int = R_MOD, n8: int = 32) -> bytes:
    return (struct.pack("<I", n8) + prime.to_bytes(n8, "little") + struct.pack("<IIII", n_wires, *counts)
            + struct.pack("<Q", n_wires + 3) + struct.pack("<I", n_constraints))


def encode(n_wires: int, cons: list[Constraint], labels: list[int] | None = None,
           order: tuple[int, ...] = (1, 2, 3), counts: tuple[int, int, int] = (1, 1, 1)) -> bytes:
    """Reference .r1cs bytes; ``order`` is the section order (circom writes 2, 1, 3)."""
    body = {
        1: header(n_wires, counts, len(cons)),
        2: b"".join(enc_lc(a) + enc_lc(b) + enc_lc(c) for a, b, c in cons),
        3: b"".join(struct.pack("<Q", x) for x in (labels if labels is not None else range(n_wires))),
    }
    out = b"r1cs" + struct.pack("<II", 1, len(order))
    for sid in order:
        out += struct.pack("<IQ", sid, len(body[sid])) + body[sid]
    return out


def random_system(rng: random.Random, n_wires: int, n_constraints: int, max_terms: int = 4) -> list[Constraint]:
    def lc() -> LC:
        wires = rng.sample(range(n_wires), rng.randint(0, min(max_terms, n_wires)))
        if rng.random() < 0.5:
            wires.sort()  # circom writes sorted terms; unsorted ones must survive too
        coefs = [rng.choice([0, 1, R_MOD - 1, rng.randrange(R_MOD)]) for _ in wires]
        return list(zip(wires, coefs))
    return [(lc(), lc(), lc()) for _ in range(n_constraints)]


def matrix_terms(m: CsrMatrix) -> list[LC]:
    vals = limbs_to_ints(m.data) if m.nnz else []
    return [[(int(m.indices[k]), vals[k]) for k in range(m.indptr[r], m.indptr[r + 1])] for r in range(m.n_rows)]


def as_constraints(r: R1CS) -> list[Constraint]:
    return list(zip(matrix_terms(r.a), matrix_terms(r.b), matrix_terms(r.c)))


def to_matrix(rows: list[LC], n_wires: int) -> CsrMatrix:
    indptr = np.cumsum([0] + [len(lc) for lc in rows]).astype(np.int64)
    terms = [t for lc in rows for t in lc]
    idx = np.array([w for w, _ in terms], dtype=np.uint32)
    data = ints_to_limbs([c for _, c in terms], 4) if terms else np.zeros((0, 4), np.uint64)
    return CsrMatrix(indptr, idx, data, n_wires)


def build(n_wires: int, cons: list[Constraint], labels: np.ndarray | None = None) -> R1CS:
    return R1CS(R_MOD, n_wires, 1, 1, 1, n_wires + 3, len(cons),
                *(to_matrix([c[m] for c in cons], n_wires) for m in range(3)), labels, None)


def test_read_reference_file_in_any_section_order(tmp_path: Path) -> None:
    print("seed", SEED)
    rng = random.Random(SEED)
    cons = random_system(rng, 20, 50)
    labels = [rng.randrange(2**64) for _ in range(20)]
    for order in ((1, 2, 3), (2, 1, 3), (3, 2, 1)):
        data = encode(20, cons, labels, order)
        path = tmp_path / "c.r1cs"
        path.write_bytes(data)
        for r in (read_r1cs(path), read_r1cs(data)):
            assert (r.prime, r.n_wires, r.n_pub_out, r.n_pub_in, r.n_prv_in) == (R_MOD, 20, 1, 1, 1)
            assert (r.n_labels, r.n_constraints, r.n_public) == (23, 50, 2)
            assert as_constraints(r) == cons
            assert r.wire_to_label is not None and r.wire_to_label.tolist() == labels
            assert r.a.n_cols == 20 and r.a.data.dtype == np.uint64
        assert read_r1cs(path).path == str(path)


def test_writer_matches_reference_bytes(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    cons = random_system(rng, 30, 200)
    labels = np.array([rng.randrange(2**64) for _ in range(30)], dtype=np.uint64)
    path = tmp_path / "w.r1cs"
    write_r1cs(path, build(30, cons, labels))
    assert path.read_bytes() == encode(30, cons, labels.tolist())
    write_r1cs(path, build(30, cons, None))  # no map: identity labels
    assert path.read_bytes() == encode(30, cons, None)


def test_streamed_writer_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cuzk_mp.formats.r1cs as mod
    monkeypatch.setattr(mod, "_ENCODE_CHUNK_BYTES", 300)  # force many small chunks (and single huge rows)
    rng = random.Random(SEED + 2)
    cons = random_system(rng, 40, 300, max_terms=12)
    path = tmp_path / "s.r1cs"
    write_r1cs(path, build(40, cons))
    assert path.read_bytes() == encode(40, cons)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_roundtrip_hypothesis(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    n_wires = data.draw(st.integers(4, 12))
    coef = st.one_of(st.sampled_from([0, 1, 2, R_MOD - 1]), st.integers(0, R_MOD - 1))
    lc = st.lists(st.tuples(st.integers(0, n_wires - 1), coef), max_size=5, unique_by=lambda t: t[0])
    cons = data.draw(st.lists(st.tuples(lc, lc, lc), max_size=12))
    path = tmp_path_factory.mktemp("h") / "h.r1cs"
    write_r1cs(path, build(n_wires, cons))
    back = read_r1cs(path)
    assert as_constraints(back) == [tuple(c) for c in cons]
    assert path.read_bytes() == encode(n_wires, cons)


def test_no_map_section_gives_none() -> None:
    data = encode(5, random_system(random.Random(1), 5, 3), order=(1, 2))
    assert read_r1cs(data).wire_to_label is None


def bad(data: bytes, pattern: str) -> None:
    with pytest.raises(FormatError, match=pattern):
        read_r1cs(data, name="bad.r1cs")


def replace_section(data_sections: dict[int, bytes], order: tuple[int, ...] = (1, 2, 3)) -> bytes:
    out = b"r1cs" + struct.pack("<II", 1, len(order))
    for sid in order:
        out += struct.pack("<IQ", sid, len(data_sections[sid])) + data_sections[sid]
    return out


def sections_of(n_wires: int, cons: list[Constraint]) -> dict[int, bytes]:
    return {1: header(n_wires, (1, 1, 1), len(cons)),
            2: b"".join(enc_lc(a) + enc_lc(b) + enc_lc(c) for a, b, c in cons),
            3: b"".join(struct.pack("<Q", x) for x in range(n_wires))}


def test_header_errors() -> None:
    cons = random_system(random.Random(2), 6, 4)
    s = sections_of(6, cons)
    bad(replace_section({**s, 1: header(6, (1, 1, 1), 4, prime=R_MOD + 2)}),
        r"bad\.r1cs, section 1 \(header\): not a BLS12-381 circuit: prime is 0x73ed")
    bad(replace_section({**s, 1: header(6, (1, 1, 1), 4, prime=7, n8=8)}), r"section 1 \(header\): n8 is 8, expected 32")
    bad(replace_section({**s, 1: s[1] + b"\0"}), r"section 1 \(header\): size is 65 bytes, its fields take 64")
    bad(replace_section({**s, 1: s[1][:-2]}), r"section 1 \(header\): truncated in field n_constraints")
    bad(replace_section({**s, 1: header(6, (3, 3, 0), 4)}), r"section 1 \(header\): nWires 6 < 1 \+ nPubOut \+ nPubIn = 7")
    # circom counts a private input it dropped as unused in nPrvIn, without a wire: still readable
    assert read_r1cs(replace_section({**s, 1: header(6, (2, 2, 9), 4)})).n_prv_in == 9
    bad(b"r1cs" + struct.pack("<II", 2, 0), r"bad\.r1cs: version 2 not supported")
    bad(b"wtns" + struct.pack("<II", 1, 0), r"bad\.r1cs: wrong magic")
    bad(replace_section(s, (2, 3)), r"section 1 \(header\): missing")
    bad(replace_section(s, (1, 3)), r"section 2 \(constraints\): missing")
    bad(replace_section({**s, 4: b""}, (1, 2, 3, 4)), r"section 4 \(custom gates list\): custom gates are PLONK-only")
    bad(replace_section({**s, 3: s[3][:-8]}), r"section 3 \(wire-to-label map\): size is 40 bytes, expected 48")


def test_constraint_errors() -> None:
    ok: Constraint = ([(0, 1), (2, 5)], [(1, 1)], [(3, 7)])
    cases = [
        (([(0, 1), (9, 5)], [(1, 1)], []), r"constraint 2, matrix A, term 1: wire id 9 >= nWires 6"),
        (([(0, 1)], [(1, R_MOD)], []), r"constraint 2, matrix B, term 0: coefficient 0x73ed.* >= r"),
        (([(0, 1)], [(1, 1)], [(4, 1), (2, 1), (4, 3)]), r"constraint 2, matrix C, term 2: wire 4 appears twice"),
    ]
    for broken, pattern in cases:
        s = sections_of(6, [ok, ok, broken, ok])
        bad(replace_section(s), r"bad\.r1cs, section 2 \(constraints\): " + pattern)
    s = sections_of(6, [ok, ok])
    bad(replace_section({**s, 2: s[2] + b"\0" * 5}), r"section 2 \(constraints\): 5 extra bytes after the last of 2")
    for cut in range(1, len(s[2])):
        bad(replace_section({**s, 2: s[2][:-cut]}), r"section 2 \(constraints\): (truncated in constraint [01] of 2|"
                                                     r"2 constraints declared, but the section's \d+ bytes hold at most [01] )")
    # a count no section could hold is refused before anything of that size is allocated
    bad(replace_section({**s, 1: header(6, (1, 1, 1), 0x7FFFFFFF)}),
        r"section 2 \(constraints\): 2147483647 constraints declared, but the section's 312 bytes hold at most 26 "
        r"\(each takes at least 12\)")


def test_every_file_truncation() -> None:
    data = encode(6, random_system(random.Random(3), 6, 5))
    for cut in range(len(data)):
        with pytest.raises(FormatError, match=r"^cut\.r1cs"):
            read_r1cs(data[:cut], name="cut.r1cs")


def test_writer_rejects_bad_input(tmp_path: Path) -> None:
    r = build(4, [([(0, 1)], [(1, 1)], [(2, 1)])])
    r.a.data[0, 3] = np.uint64(2**64 - 1)
    with pytest.raises(ValueError, match="constraint 0, matrix A: coefficient >= r"):
        write_r1cs(tmp_path / "x.r1cs", r)
    r = build(4, [([(0, 1)], [(1, 1)], [(2, 1)])])
    r.c.indices[0] = 4
    with pytest.raises(ValueError, match="constraint 0, matrix C: wire id >= n_wires"):
        write_r1cs(tmp_path / "x.r1cs", r)
    r = build(4, [([(0, 1)], [(1, 1)], [(2, 1)])])
    r.n_constraints = 2
    with pytest.raises(ValueError, match="r1cs.a has 1 rows, n_constraints is 2"):
        write_r1cs(tmp_path / "x.r1cs", r)
    assert not list(tmp_path.iterdir())


def test_empty_system(tmp_path: Path) -> None:
    path = tmp_path / "e.r1cs"
    write_r1cs(path, build(4, []))
    r = read_r1cs(path)
    assert r.n_constraints == 0 and r.a.nnz == 0 and r.a.n_rows == 0
