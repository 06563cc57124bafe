"""The witness map on the device (cuzk_mp.backends.gpu.witness_map) against the host's.

Two kinds, as tests/test_gpu_msm.py: ``emu`` (the kernel compiled as host C++, marker ``slow``)
and ``gpu`` (marker ``gpu``). The oracle is the definition in Python ints (a_r = sum of v w
over row r, in Montgomery form: the bytes the host's :func:`cuzk_mp.algebra.coded_sparse.evaluate_rows_into`
writes too). Inputs: coded rows with every per-entry path (witness 0 and 1,
coefficients +1 and -1 over any witness value, other coefficients), empty rows, fewer rows than
the domain (zero padding), uint16 and uint32 codes, the edge values 1, r - 1 in the witness.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest

from cuzk_mp.algebra.coded_sparse import CodedMatrix
from cuzk_mp.algebra.row_codes import CODE_MINUS_ONE, CODE_ONE
from cuzk_mp.algebra.field import FR, R_MOD, ints_to_limbs, limbs_to_ints
from tests.gpu_emu import module_for

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def wm(kind: str) -> Any:
    print(f"seed {SEED}")
    return module_for(kind, "witness_map")


def _rows(rng: random.Random, n_rows: int, n_vars: int, n_codes: int, dtype: type) -> CodedMatrix:
    """Mostly short rows (0-8 entries), some long ones (17-70: a thread per segment, then a sum per
    row) and one of 300 (many segments)."""
    def count() -> int:
        p = rng.random()
        return 0 if p < 0.1 else rng.randrange(17, 71) if p < 0.14 else rng.randrange(1, 9)

    counts = [count() for _ in range(n_rows)]
    counts[rng.randrange(n_rows)] = 300
    indptr = np.zeros(n_rows + 1, dtype=np.uint32)
    indptr[1:] = np.cumsum(counts)
    nnz = int(indptr[-1])
    cols = np.array([rng.randrange(n_vars) for _ in range(nnz)], dtype=np.uint32)
    pick = [rng.random() for _ in range(nnz)]
    codes = np.array([CODE_ONE if p < 0.35 else CODE_MINUS_ONE if p < 0.5 else rng.randrange(2, n_codes)
                      for p in pick], dtype=dtype)
    return CodedMatrix(indptr, cols, codes)


def _case(seed: int, dtype: type, domain: int = 512, n_vars: int = 300) -> tuple[Any, ...]:
    rng = random.Random(seed)
    n_codes = 40
    values = [1, R_MOD - 1] + [rng.randrange(R_MOD) for _ in range(n_codes - 2)]
    tmont = ints_to_limbs([FR.to_mont_int(v) for v in values], 4)
    tr2 = ints_to_limbs([FR.to_mont_int(FR.to_mont_int(v)) for v in values], 4)
    a = _rows(rng, domain - 37, n_vars, n_codes, dtype)  # fewer rows than the domain: zero padding
    b = _rows(rng, domain - 5, n_vars, n_codes, dtype)
    wv = [1] + [rng.choice([0, 1, R_MOD - 1, rng.randrange(R_MOD), rng.randrange(1 << 64)]) for _ in range(n_vars - 1)]
    return a, b, tmont, tr2, ints_to_limbs(wv, 4), domain


def _host(a: CodedMatrix, b: CodedMatrix, tmont: np.ndarray, tr2: np.ndarray, w: np.ndarray,
          domain: int) -> list[np.ndarray]:
    """a, b, c (Montgomery form) from the definition: the coefficient of code k is v_k = tmont[k] R^-1."""
    values = [FR.from_mont_int(x) for x in limbs_to_ints(tmont)]
    wv = limbs_to_ints(w)

    def rows(m: CodedMatrix) -> list[int]:
        ptr = m.indptr.tolist()
        out = [sum(values[int(m.codes[k])] * wv[int(m.cols[k])] for k in range(ptr[r], ptr[r + 1])) % R_MOD
               for r in range(m.n_rows)]
        return out + [0] * (domain - m.n_rows)

    va, vb = rows(a), rows(b)
    vc = [x * y % R_MOD for x, y in zip(va, vb)]
    return [ints_to_limbs([FR.to_mont_int(x) for x in xs], 4) for xs in (va, vb, vc)]


def _device(kind: str, wm: Any, a: CodedMatrix, b: CodedMatrix, tmont: np.ndarray, tr2: np.ndarray, w: np.ndarray,
            domain: int) -> list[np.ndarray]:
    xp = np if kind == "emu" else __import__("cupy")
    dmap = wm.DeviceWitnessMap(a, b, tmont, tr2, domain)
    assert dmap.nbytes == wm.matrices_bytes(a, b, tmont, tr2)
    out = [xp.full((domain, 4), 7, dtype=np.uint64) for _ in range(3)]  # garbage: every row must be written
    dmap.run(xp.asarray(w), *out)
    dmap.close()
    return [np.asarray(o) if kind == "emu" else o.get() for o in out]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32], ids=["u16", "u32"])
def test_witness_map_matches_host(kind: str, wm: Any, dtype: type) -> None:
    case = _case(SEED, dtype)
    long = wm.LongRows.of(case[0], case[1])
    assert long.rows.size and long.segments > long.rows.size  # the long rows' path runs too
    for got, want, name in zip(_device(kind, wm, *case), _host(*case), "abc"):
        assert np.array_equal(got, want), f"seed {SEED} {name}"


def test_witness_map_refuses_bad_rows(wm: Any) -> None:
    from cuzk_mp.errors import InputError

    a, b, tmont, tr2, _, domain = _case(SEED, np.uint16)
    with pytest.raises(InputError, match="rows for a domain of 64"):
        wm.DeviceWitnessMap(a, b, tmont, tr2, 64)
    b32 = CodedMatrix(b.indptr, b.cols, b.codes.astype(np.uint32))
    with pytest.raises(InputError, match="codes must be uint16 or uint32 in both"):
        wm.DeviceWitnessMap(a, b32, tmont, tr2, domain)


def test_long_rows_are_cut_into_segments_that_cover_them(wm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """LongRows lists exactly the rows with more than ``short_max`` entries on a side (rows past a
    matrix's last one have none there), scanning the row lengths a block at a time, and cuts each
    side of such a row into consecutive segments of 1..short_max entries, B's flagged."""
    rng = np.random.default_rng(SEED)

    def matrix(n: int) -> CodedMatrix:
        counts = np.where(rng.random(n) < 0.05, rng.integers(17, 80, n), rng.integers(0, 9, n))
        indptr = np.zeros(n + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(counts)
        nnz = int(indptr[-1])
        return CodedMatrix(indptr, np.zeros(nnz, dtype=np.uint32), np.zeros(nnz, dtype=np.uint16))

    for na, nb, scan in ((1000, 990, 64), (500, 700, 100), (10, 10, 4)):
        monkeypatch.setattr(wm, "SCAN_ROWS", scan)
        a, b = matrix(na), matrix(nb)
        long = wm.LongRows.of(a, b, 16)
        n = max(na, nb)
        lens = [np.zeros(n, dtype=np.int64) for _ in "ab"]
        for m, ln in zip((a, b), lens):
            ln[: m.n_rows] = np.diff(m.indptr.astype(np.int64))
        assert np.array_equal(long.rows, np.flatnonzero((lens[0] > 16) | (lens[1] > 16)))
        for i, r in enumerate(long.rows.tolist()):
            sides = ((a, long.first[i], long.mid[i], 0), (b, long.mid[i], long.first[i + 1], wm.SEG_B))
            for m, lo_s, hi_s, flag in sides:
                pos = int(m.indptr[r]) if r < m.n_rows else 0
                end = int(m.indptr[r + 1]) if r < m.n_rows else 0
                for seg in range(int(lo_s), int(hi_s)):
                    count = int(long.seg_n[seg]) & ~wm.SEG_B
                    assert int(long.seg_n[seg]) & wm.SEG_B == flag and int(long.seg_k[seg]) == pos
                    assert 0 < count <= 16
                    pos += count
                assert pos == end
