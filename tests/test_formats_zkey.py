"""Tests for cuzk_mp.formats.zkey: snarkjs Groth16 .zkey read/write, validation, coef matrices.

Oracle: a plain-Python encoder of snarkjs-formats.md 5.6 written here, and
Python-int bookkeeping of the coefficient entries.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra.field import Q_MOD, R_MOD, ints_to_limbs, limbs_to_ints
from cuzk_mp.errors import FormatError
from cuzk_mp.formats.zkey import (
    COEF_DTYPE, ZKey, coef_matrices, coefs_from_arrays, empty_contributions, read_zkey, write_zkey,
)

SEED = 424242
N_VARS, N_PUBLIC, DOMAIN = 9, 2, 16


def rand_points(rng: random.Random, n: int, coords: int) -> np.ndarray:
    vals = [0 if rng.random() < 0.2 else rng.randrange(Q_MOD) for _ in range(n * coords)]
    if n * coords:
        vals[0] = Q_MOD - 1
    return ints_to_limbs(vals, 6).reshape(n, coords * 6) if n else np.zeros((0, coords * 6), np.uint64)


def rand_coefs(rng: random.Random, n: int) -> list[tuple[int, int, int, int]]:
    out = [(rng.randrange(2), rng.randrange(DOMAIN), rng.randrange(N_VARS), rng.randrange(R_MOD)) for _ in range(n)]
    out.sort(key=lambda e: e[1])  # snarkjs sorts by constraint (stable)
    return out


def make_zkey(seed: int = SEED, n_coefs: int = 40) -> ZKey:
    rng = random.Random(seed)
    head = {k: rand_points(rng, 1, c)[0] for k, c in
            (("alpha1", 2), ("beta1", 2), ("beta2", 4), ("gamma2", 4), ("delta1", 2), ("delta2", 4))}
    ents = rand_coefs(rng, n_coefs)
    coefs = coefs_from_arrays(*(np.array([e[i] for e in ents], dtype=np.uint32) for i in range(3)),
                              ints_to_limbs([e[3] for e in ents], 4) if ents else np.zeros((0, 4), np.uint64))
    return ZKey(
        path=None, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=N_VARS, n_public=N_PUBLIC, domain_size=DOMAIN,
        ic=rand_points(rng, N_PUBLIC + 1, 2), coefs=coefs, a=rand_points(rng, N_VARS, 2),
        b1=rand_points(rng, N_VARS, 2), b2=rand_points(rng, N_VARS, 4),
        c=rand_points(rng, N_VARS - N_PUBLIC - 1, 2), h=rand_points(rng, DOMAIN, 2),
        contributions=empty_contributions(bytes(range(64))) + b"extra", **head,
    )


def ref_sections(z: ZKey) -> dict[int, bytes]:
    """Reference encoding of every section, field by field."""
    le = lambda v, n: int(v).to_bytes(n, "little")  # noqa: E731
    pts = lambda arr: b"".join(le(x, 48) for x in limbs_to_ints(np.asarray(arr).reshape(-1, 6)))  # noqa: E731
    head = (le(48, 4) + le(Q_MOD, 48) + le(32, 4) + le(R_MOD, 32) + le(z.n_vars, 4) + le(z.n_public, 4)
            + le(z.domain_size, 4) + b"".join(pts(getattr(z, k)) for k in
                                              ("alpha1", "beta1", "beta2", "gamma2", "delta1", "delta2")))
    coefs = le(len(z.coefs), 4) + b"".join(
        le(e["matrix"], 4) + le(e["constraint"], 4) + le(e["signal"], 4) + le(limbs_to_ints(e["value"])[0], 32)
        for e in z.coefs)
    return {1: le(1, 4), 2: head, 3: pts(z.ic), 4: coefs, 5: pts(z.a), 6: pts(z.b1), 7: pts(z.b2),
            8: pts(z.c), 9: pts(z.h), 10: z.contributions}


def assemble(sec: dict[int, bytes], order: list[int] | None = None) -> bytes:
    order = order or sorted(sec)
    out = b"zkey" + struct.pack("<II", 1, len(order))
    for sid in order:
        out += struct.pack("<IQ", sid, len(sec[sid])) + sec[sid]
    return out


def assert_same(a: ZKey, b: ZKey) -> None:
    for k in ("n8q", "q", "n8r", "r", "n_vars", "n_public", "domain_size", "contributions"):
        assert getattr(a, k) == getattr(b, k), k
    for k in ("alpha1", "beta1", "beta2", "gamma2", "delta1", "delta2", "ic", "a", "b1", "b2", "c", "h", "coefs"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k


def test_write_matches_reference_and_reads_back(tmp_path: Path) -> None:
    print("seed", SEED)
    z = make_zkey()
    sec = ref_sections(z)
    assert len(sec[2]) == 964
    path = tmp_path / "k.zkey"
    write_zkey(path, z)
    assert path.read_bytes() == assemble(sec)
    with read_zkey(path) as back:
        assert_same(z, back)
        assert back.path == str(path) and back.log_domain == 4
        for k in ("ic", "a", "b1", "b2", "c", "h", "coefs"):
            arr = getattr(back, k)
            assert not arr.flags.writeable and not arr.flags.owndata, k  # a view over the mapping
        assert back.alpha1.shape == (12,) and back.beta2.shape == (24,) and back.alpha1.dtype == np.uint64


def test_snarkjs_setup_section_order(tmp_path: Path) -> None:
    z = make_zkey(SEED + 1)
    for order in ([1, 2, 4, 3, 9, 8, 5, 6, 7, 10], [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]):
        assert_same(z, read_zkey(assemble(ref_sections(z), order), name="mem.zkey"))


def test_chunked_write(tmp_path: Path) -> None:
    z = make_zkey(SEED + 2)
    whole = tmp_path / "whole.zkey"
    write_zkey(whole, z)
    parts = ZKey(**{**z.__dict__, "h": [z.h[:5], z.h[5:5], z.h[5:]], "b2": [z.b2[:1], z.b2[1:]],
                    "coefs": [z.coefs[:7], z.coefs[7:]], "a": list(np.array_split(z.a, 4))})
    chunked = tmp_path / "chunked.zkey"
    write_zkey(chunked, parts)
    assert chunked.read_bytes() == whole.read_bytes()


def test_close_releases_and_views_survive(tmp_path: Path) -> None:
    path = tmp_path / "k.zkey"
    z = make_zkey()
    write_zkey(path, z)
    key = read_zkey(path)
    h = key.h
    key.close()
    assert key.h is None and key.a is None
    assert np.array_equal(h, z.h)  # a view taken before close keeps the mapping alive
    key.close()  # idempotent


def test_coef_matrices_against_python_oracle() -> None:
    z = make_zkey(SEED + 3, n_coefs=200)
    a, b = coef_matrices(z)
    rows: dict[int, list[list[tuple[int, int]]]] = {0: [[] for _ in range(DOMAIN)], 1: [[] for _ in range(DOMAIN)]}
    for e in z.coefs:
        rows[int(e["matrix"])][int(e["constraint"])].append((int(e["signal"]), limbs_to_ints(e["value"])[0]))
    for m, mat in ((0, a), (1, b)):
        assert mat.n_rows == DOMAIN and mat.n_cols == N_VARS and mat.data.dtype == np.uint64
        vals = limbs_to_ints(mat.data)
        got = [[(int(mat.indices[k]), vals[k]) for k in range(mat.indptr[r], mat.indptr[r + 1])] for r in range(DOMAIN)]
        assert got == rows[m]


def bad(sec: dict[int, bytes], pattern: str, order: list[int] | None = None) -> None:
    with pytest.raises(FormatError, match=pattern):
        read_zkey(assemble(sec, order), name="bad.zkey")


def test_header_errors() -> None:
    z = make_zkey()
    sec = ref_sections(z)
    h = sec[2]
    bad({**sec, 1: struct.pack("<I", 2)}, r"bad\.zkey, section 1 \(protocol\): protocol is 2 \(PLONK\), only Groth16")
    bad({**sec, 1: struct.pack("<I", 10)}, r"protocol is 10 \(FFLONK\)")
    bad({**sec, 1: struct.pack("<I", 7)}, r"protocol is 7 \(unknown\)")
    bad({**sec, 2: struct.pack("<I", 32) + h[4:]}, r"section 2 \(header\): n8q is 32, expected 48")
    bad({**sec, 2: h[:-4]}, r"section 2 \(header\): size is 960 bytes, expected 964")
    bad({**sec, 2: h[:4] + (Q_MOD + 2).to_bytes(48, "little") + h[52:]}, r"section 2 \(header\): not a BLS12-381 key: q is")
    bad({**sec, 2: h[:52] + struct.pack("<I", 48) + h[56:]}, r"section 2 \(header\): n8r is 48")
    bad({**sec, 2: h[:56] + (R_MOD - 1).to_bytes(32, "little") + h[88:]}, r"not a BLS12-381 key: r is")
    bad({**sec, 2: h[:96] + struct.pack("<I", 12) + h[100:]}, r"section 2 \(header\): domainSize 12 is not a power of two")
    bad({**sec, 2: h[:88] + struct.pack("<I", 2) + h[92:]}, r"section 2 \(header\): nVars 2 < nPublic \+ 1 = 3")
    q_bytes = Q_MOD.to_bytes(48, "little")
    bad({**sec, 2: h[:100 + 96 + 48] + q_bytes + h[100 + 96 + 96:]}, r"section 2 \(header\): beta1: coordinate 1 is >= q")


def test_section_size_errors() -> None:
    sec = ref_sections(make_zkey())
    expect = {3: 3 * 96, 5: 9 * 96, 6: 9 * 96, 7: 9 * 192, 8: 6 * 96, 9: 16 * 96}
    labels = {3: "IC", 5: "A", 6: "B1", 7: "B2", 8: "C", 9: "H"}
    for sid, size in expect.items():
        assert len(sec[sid]) == size
        for delta in (-96, -1, 1, 96):
            bad({**sec, sid: sec[sid][:size + delta] if delta < 0 else sec[sid] + bytes(delta)},
                rf"section {sid} \({labels[sid]}\): size is {size + delta} bytes, expected {size}")
    bad({**sec, 4: sec[4][:-1]}, r"section 4 \(coefs\): size is \d+ bytes, expected \d+")
    bad({**sec, 4: b"\0\0"}, r"section 4 \(coefs\): truncated in field nCoefs")
    bad({**sec, 10: bytes(67)}, r"section 10 \(contributions\): size is 67 bytes, at least 68 expected")
    for sid in range(1, 11):
        bad(sec, rf"section {sid} \({'|'.join(['protocol', 'header', 'IC', 'coefs', 'A', 'B1', 'B2', 'C', 'H', 'contributions'])}\): missing",
            [s for s in range(1, 11) if s != sid])


def test_coef_and_point_errors() -> None:
    z = make_zkey()
    cases = [("matrix", 2, r"coefficient 5: matrix is 2, expected 0 \(A\) or 1 \(B\)"),
             ("constraint", DOMAIN, rf"coefficient 5: constraint {DOMAIN} >= domainSize {DOMAIN}"),
             ("signal", N_VARS, rf"coefficient 5: signal {N_VARS} >= nVars {N_VARS}")]
    for field, value, pattern in cases:
        coefs = z.coefs.copy()
        coefs[field][5] = value
        bad(ref_sections(ZKey(**{**z.__dict__, "coefs": coefs})), r"bad\.zkey, section 4 \(coefs\): " + pattern)
    for v in (R_MOD, 2**256 - 1):
        coefs = z.coefs.copy()
        coefs["value"][5] = ints_to_limbs([v], 4)[0]
        bad(ref_sections(ZKey(**{**z.__dict__, "coefs": coefs})), r"section 4 \(coefs\): coefficient 5: value is >= r")
    # check_coefs=False (a caller whose circuit comes from a cache checked at its build) reads the
    # entries as they are; the section's size is still checked
    coefs = z.coefs.copy()
    coefs["matrix"][5] = 2
    sec = ref_sections(ZKey(**{**z.__dict__, "coefs": coefs}))
    assert read_zkey(assemble(sec), check_coefs=False).coefs["matrix"][5] == 2
    with pytest.raises(FormatError, match=r"section 4 \(coefs\): size is \d+ bytes, expected \d+"):
        read_zkey(assemble({**sec, 4: sec[4][:-1]}), check_coefs=False)
    ic = z.ic.copy()
    ic[2, 6:] = ints_to_limbs([Q_MOD], 6)[0]
    bad(ref_sections(ZKey(**{**z.__dict__, "ic": ic})), r"section 3 \(IC\): point 2: coordinate 1 is >= q")


def test_every_truncation() -> None:
    data = assemble(ref_sections(make_zkey(n_coefs=3)))
    for cut in list(range(0, 200)) + list(range(200, len(data), 37)) + [len(data) - 1]:
        with pytest.raises(FormatError, match=r"^cut\.zkey"):
            read_zkey(data[:cut], name="cut.zkey")


def test_writer_rejects_inconsistent_keys(tmp_path: Path) -> None:
    z = make_zkey()
    with pytest.raises(ValueError, match=r"zkey.h has 15 rows, expected 16"):
        write_zkey(tmp_path / "x.zkey", ZKey(**{**z.__dict__, "h": z.h[1:]}))
    with pytest.raises(ValueError, match=r"zkey.b2 chunk 0: expected \(n, 24\) uint64"):
        write_zkey(tmp_path / "x.zkey", ZKey(**{**z.__dict__, "b2": z.a}))
    with pytest.raises(ValueError, match=r"zkey.coefs chunk 0: expected a 1-d COEF_DTYPE array"):
        write_zkey(tmp_path / "x.zkey", ZKey(**{**z.__dict__, "coefs": np.zeros(3, np.uint64)}))
    with pytest.raises(ValueError, match=r"contributions is 0 bytes"):
        write_zkey(tmp_path / "x.zkey", ZKey(**{**z.__dict__, "contributions": b""}))
    assert not list(tmp_path.iterdir())


def test_coef_dtype() -> None:
    assert COEF_DTYPE.itemsize == 44
    assert COEF_DTYPE.names == ("matrix", "constraint", "signal", "value")


def test_coef_matrices_rejects_out_of_range_entries() -> None:
    z = make_zkey()
    coefs = z.coefs.copy()
    coefs["constraint"][3] = DOMAIN
    with pytest.raises(ValueError, match=rf"zkey coefficient 3: matrix \d, constraint {DOMAIN} \(domain {DOMAIN}\)"):
        coef_matrices(ZKey(**{**z.__dict__, "coefs": coefs}))
    coefs = z.coefs.copy()
    coefs["signal"][3] = N_VARS
    with pytest.raises(ValueError, match=rf"signal {N_VARS} >= n_vars {N_VARS}"):
        coef_matrices(ZKey(**{**z.__dict__, "coefs": coefs}))


def test_file_backed_key_pickles_as_its_path(tmp_path: Path) -> None:
    import pickle
    path = tmp_path / "k.zkey"
    z = make_zkey()
    write_zkey(path, z)
    with read_zkey(path) as key:
        blob = pickle.dumps(key)
        assert len(blob) < 1000 and key.h.nbytes > 1000
        with pickle.loads(blob) as again:
            assert_same(z, again)
            assert again.path == str(path)
    in_memory = pickle.loads(pickle.dumps(z))  # no file behind it: pickled by value
    assert_same(z, in_memory)
