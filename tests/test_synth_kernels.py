"""The coded witness-map kernel against the 32-byte CSR reference and Python ints.

Oracles: ``fr.csr_matvec`` over v R^2 coefficients (the replaced implementation, a separate
kernel) and ``fr.mul`` for a, b, c; Python-int dot products for the witness check. Inputs are
drawn by hypothesis: witness values 0, 1, r-1 and random; coefficients +-1, small and random;
empty rows; row counts that are not multiples of the block; outputs longer than the matrices
(rows past them are 0). Every thread count gives the same bytes.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.coded_sparse import CodedMatrix, DistinctValues, code_dtype, evaluate_rows_into
from cuzk_mp.algebra.field import R_MOD, limbs_to_ints
from cuzk_mp.algebra.row_codes import CODE_MINUS_ONE, CODE_ONE
from cuzk_mp.algebra.sparse import CsrMatrix
from cuzk_mp.algebra.threads import numba_threads, pool_size

WITNESS_VALUES = st.one_of(st.sampled_from([0, 1, 0, 1, 2, R_MOD - 1]), st.integers(0, R_MOD - 1))
COEFS = st.one_of(st.sampled_from([1, R_MOD - 1, 1, R_MOD - 1, 2, 3, R_MOD - 2]), st.integers(1, R_MOD - 1))


class Table:
    """Codes for coefficients the way the cache assigns them: +-1 reserved, then first appearance."""

    def __init__(self) -> None:
        self.values = [1, R_MOD - 1]

    def code(self, v: int) -> int:
        if v not in self.values:
            self.values.append(v)
        return self.values.index(v)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        mont = fr.from_ints(self.values)  # v R
        return mont, fr.to_mont(mont)  # v R^2


def coded(rows: list[list[tuple[int, int]]], table: Table) -> CodedMatrix:
    ptr = np.zeros(len(rows) + 1, dtype=np.uint32)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    cols = np.array([c for r in rows for c, _ in r], dtype=np.uint32)
    codes = np.array([table.code(v) for r in rows for _, v in r], dtype=code_dtype(1000))
    return CodedMatrix(ptr, cols, codes)


def reference(rows: list[list[tuple[int, int]]], w: np.ndarray, n_out: int) -> np.ndarray:
    """The replaced path: 32-byte v R^2 coefficients through fr.csr_matvec (rows past the matrix: 0)."""
    padded = rows + [[] for _ in range(n_out - len(rows))]
    indptr = np.zeros(n_out + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in padded])
    data = fr.from_ints([v for r in padded for _, v in r], mont=False) if indptr[-1] else np.zeros((0, 4), np.uint64)
    m = CsrMatrix(indptr, np.array([c for r in padded for c, _ in r], dtype=np.uint32), data, w.shape[0])
    return m.to_r2_form().matvec(w)


@st.composite
def systems(draw: st.DrawFn) -> dict[str, object]:
    n_vars = draw(st.integers(1, 12))
    n_rows = draw(st.integers(0, 40))
    row = st.lists(st.tuples(st.integers(0, n_vars - 1), COEFS), max_size=6, unique_by=lambda t: t[0])
    mats = {m: draw(st.lists(row, min_size=n_rows, max_size=n_rows)) for m in ("a", "b")}
    mats["c"] = draw(st.lists(row, min_size=0, max_size=n_rows))
    mats["b"] = mats["b"][: draw(st.integers(0, n_rows))]  # B may have fewer rows than A
    w = draw(st.lists(WITNESS_VALUES, min_size=n_vars, max_size=n_vars))
    return {"mats": mats, "w": w, "extra": draw(st.integers(0, 9)), "block": draw(st.sampled_from([1, 3, 7, 4096]))}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems())
def test_kernel_equals_reference(system: dict[str, object]) -> None:
    mats, w_ints = system["mats"], system["w"]  # type: ignore[index]
    n_out = len(mats["a"]) + system["extra"]  # type: ignore[index, operator, arg-type]
    table = Table()
    cm = {k: coded(v, table) for k, v in mats.items()}  # type: ignore[union-attr]
    tmont, tr2 = table.arrays()
    w = fr.from_ints(w_ints, mont=False)  # type: ignore[arg-type]
    ra, rb = reference(mats["a"], w, n_out), reference(mats["b"], w, n_out)  # type: ignore[index]
    rc = fr.mul(ra, rb)
    results = []
    for threads in sorted({1, pool_size()}):
        out = [np.full((n_out, 4), 0xA5, dtype=np.uint64) for _ in range(3)]  # garbage: every row is written
        with numba_threads(threads):
            first, n_bad = evaluate_rows_into(cm["a"], cm["b"], cm["c"], tmont, tr2, w, *out, block=system["block"])
        assert np.array_equal(out[0], ra) and np.array_equal(out[1], rb) and np.array_equal(out[2], rc)
        results.append((first, n_bad))
    wi = limbs_to_ints(w)
    ab = fr.to_ints(rc)
    cw = [sum(v * wi[c] for c, v in row) % R_MOD for row in mats["c"]]  # type: ignore[union-attr]
    bad = [i for i, x in enumerate(cw) if x != ab[i]]
    assert results == [((bad[0] if bad else -1), len(bad))] * len(results)


def test_no_check_and_wide_outputs() -> None:
    table = Table()
    a = coded([[(0, 5), (1, 1)], [], [(1, R_MOD - 1)]], table)
    b = coded([[(0, 1)]], table)
    tmont, tr2 = table.arrays()
    w = fr.from_ints([1, 7], mont=False)
    out = [np.full((5, 4), 7, dtype=np.uint64) for _ in range(3)]
    assert evaluate_rows_into(a, b, None, tmont, tr2, w, *out) == (-1, 0)
    assert fr.to_ints(out[0]) == [12, 0, R_MOD - 7, 0, 0]
    assert fr.to_ints(out[1]) == [1, 0, 0, 0, 0]
    assert fr.to_ints(out[2]) == [12, 0, 0, 0, 0]


def test_distinct_values_grow_and_look_up() -> None:
    rng = np.random.default_rng(5)
    vals = fr.from_ints([int(x) for x in rng.integers(0, 3000, size=20000)], mont=False)
    dv = DistinctValues(capacity=4)
    dv.add(vals[:7000])
    dv.add(vals[7000:])
    ints = limbs_to_ints(vals)
    order = list(dict.fromkeys(ints))
    assert limbs_to_ints(dv.values) == order
    remap = np.arange(dv.count, dtype=np.uint32) + 10
    out = np.empty(vals.shape[0], dtype=np.uint32)
    dv.lookup_into(vals, remap, out)
    assert out.tolist() == [order.index(x) + 10 for x in ints]
    assert (CODE_ONE, CODE_MINUS_ONE) == (0, 1)
