"""The development setup's host steps against the straightforward formulas they replace.

Seeded random R1CSs (rows with no entries, a column repeated inside one row, columns in no row,
coefficients 0 and -1): the column sums (a transposed product split over column ranges) equal
the sums over an explicitly transposed CSR matrix, for any number of ranges; the QAP columns
equal the combination done with separate scale/add passes; the fused Lagrange ratios and the H
scalars equal powers, inversion and scalings done one by one; the coefficient section (a
row-parallel fill, whole or in chunks) equals the numpy scatter; the streamed ``setup_file``
writes the very bytes of ``write_zkey(setup(...))`` and logs each host step; a stream with the
wrong row count fails and leaves no file.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.field import FR, R_MOD, fr_root_of_unity, int_to_limbs
from cuzk_mp.algebra.sparse import CsrMatrix, from_coo
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.formats.r1cs import R1CS, write_r1cs
from cuzk_mp.formats.zkey import COEF_DTYPE, ChunkStream, coefs_from_arrays, read_zkey, write_zkey
from cuzk_mp.groth16 import setup as dev

SEEDS = (1, 2, 3, 4, 5, 6)


def _matrix(rng: np.random.Generator, n_rows: int, n_cols: int, repeats: bool) -> CsrMatrix:
    """Random CSR: some empty rows, a third of the columns never used, and (``repeats``) a column twice in
    some rows (which an .r1cs file may not hold: those stay in memory); else distinct columns per row."""
    counts = rng.integers(0, 5, size=n_rows)
    counts[rng.random(n_rows) < 0.2] = 0
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    used = rng.choice(n_cols, size=max(4, (2 * n_cols) // 3), replace=False)
    indices = np.concatenate([rng.choice(used, size=int(k), replace=False) for k in counts]).astype(np.uint32)
    if repeats:
        for r in np.flatnonzero(counts >= 2)[::3]:  # a column twice in one row
            indices[indptr[r] + 1] = indices[indptr[r]]
    values = [int.from_bytes(rng.bytes(32), "little") % R_MOD for _ in range(indices.shape[0])]
    for i in range(0, len(values), 7):
        values[i] = (0, 1, R_MOD - 1)[i % 3]
    return CsrMatrix(indptr, indices, fr.from_ints(values, mont=False), n_cols)


def _r1cs(seed: int, repeats: bool = True) -> R1CS:
    rng = np.random.default_rng(seed)
    n_c = int(rng.integers(1, 200))
    n_wires = int(rng.integers(5, 300))
    n_pub_out, n_pub_in = int(rng.integers(0, 3)), int(rng.integers(1, 3))
    a, b, c = (_matrix(rng, n_c, n_wires, repeats) for _ in range(3))
    return R1CS(prime=R_MOD, n_wires=n_wires, n_pub_out=n_pub_out, n_pub_in=n_pub_in, n_prv_in=0, n_labels=n_wires,
                n_constraints=n_c, a=a, b=b, c=c, wire_to_label=None, path=None)


def _toxic(seed: int) -> dev.ToxicWaste:
    rng = random.Random(seed)
    return dev.ToxicWaste(*(rng.randrange(1, R_MOD) for _ in range(4)))


def _column_sums_by_transpose(m: CsrMatrix, lag: np.ndarray) -> np.ndarray:
    """The previous formula: an explicit transposed CSR (argsort), times lag."""
    rows = np.repeat(np.arange(m.n_rows, dtype=np.int64), np.diff(m.indptr))
    return from_coo(m.indices.astype(np.int64), rows, m.data, m.n_cols, m.n_rows).matvec(lag)


def _coefs_by_scatter(r1cs: R1CS) -> np.ndarray:
    """The previous formula: numpy destinations and a scatter of the packed entries."""
    a, b = r1cs.a, r1cs.b
    n_c, n_pub = r1cs.n_constraints, r1cs.n_public
    rows_a = np.repeat(np.arange(n_c, dtype=np.int64), np.diff(a.indptr))
    rows_b = np.repeat(np.arange(n_c, dtype=np.int64), np.diff(b.indptr))
    out = np.empty(a.nnz + b.nnz + n_pub + 1, dtype=COEF_DTYPE)
    out[np.arange(a.nnz) + b.indptr[rows_a]] = coefs_from_arrays(np.zeros(a.nnz, np.uint32), rows_a, a.indices,
                                                                  a.to_r2_form().data)
    out[np.arange(b.nnz) + a.indptr[rows_b + 1]] = coefs_from_arrays(np.ones(b.nnz, np.uint32), rows_b, b.indices,
                                                                      b.to_r2_form().data)
    publics = np.arange(n_pub + 1, dtype=np.uint32)
    out[a.nnz + b.nnz :] = coefs_from_arrays(np.zeros(n_pub + 1, np.uint32), n_c + publics, publics,
                                             np.broadcast_to(int_to_limbs(FR.r2, 4), (n_pub + 1, 4)))
    return out


def _lag(r1cs: R1CS, toxic: dev.ToxicWaste) -> np.ndarray:
    log_n = dev._domain_log(r1cs)
    n_rows = r1cs.n_constraints + r1cs.n_public + 1
    return dev.lagrange_values(toxic.tau, 1 << log_n, fr.powers(fr_root_of_unity(log_n), n_rows))


@pytest.mark.parametrize("seed", SEEDS)
def test_column_sums_equal_the_transposed_product(seed: int) -> None:
    r1cs = _r1cs(seed)
    lag = _lag(r1cs, _toxic(seed))
    for m in (r1cs.a, r1cs.b, r1cs.c):
        want = _column_sums_by_transpose(m, lag)
        empty = np.setdiff1d(np.arange(m.n_cols), m.indices)
        assert empty.size and not want[empty].any()  # the circuit has columns in no row: their sums are 0
        for tasks in (None, 1, 2, 3, 7, m.n_cols + 5):  # more ranges than columns: empty ranges
            got = fr.csr_rmatvec(m.indptr, m.indices, m.data, lag, m.n_cols, tasks=tasks)
            assert np.array_equal(got, want), (seed, tasks)
        assert np.array_equal(dev._column_sums(m, lag), want)
    assert any(np.any(np.diff(np.sort(r1cs.a.indices[lo:hi])) == 0)
               for lo, hi in zip(r1cs.a.indptr[:-1], r1cs.a.indptr[1:]))  # A repeats a column in some row


def test_column_sums_oracle_ints() -> None:
    """A repeated entry counts twice; a column in no row sums to 0 (Python ints)."""
    m = CsrMatrix(np.array([0, 3, 3, 4]), np.array([1, 1, 0, 1], dtype=np.uint32),
                  fr.from_ints([5, R_MOD - 1, 7, 11], mont=False), 3)
    lag_ints = [2, 3, 4]
    got = fr.to_ints(fr.csr_rmatvec(m.indptr, m.indices, m.data, fr.from_ints(lag_ints), 3, tasks=2), mont=False)
    assert got == [7 * 2 % R_MOD, (5 * 2 - 2 + 11 * 4) % R_MOD, 0]


def test_rmatvec_rejects_a_short_vector() -> None:
    m = CsrMatrix(np.array([0, 1, 2]), np.array([0, 0], dtype=np.uint32), fr.from_ints([1, 2]), 1)
    with pytest.raises(ValueError, match="2 rows"):
        m.rmatvec(fr.from_ints([1]))


@pytest.mark.parametrize("seed", SEEDS)
def test_qap_columns_equal_the_separate_passes(seed: int) -> None:
    r1cs, toxic = _r1cs(seed), _toxic(seed)
    lag = _lag(r1cs, toxic)
    u = _column_sums_by_transpose(r1cs.a, lag)
    n_pub = r1cs.n_public
    u[: n_pub + 1] = fr.add(u[: n_pub + 1], fr.from_mont(lag[r1cs.n_constraints :]))
    v = _column_sums_by_transpose(r1cs.b, lag)
    k = fr.add(fr.add(fr.scale(u, toxic.beta), fr.scale(v, toxic.alpha)), _column_sums_by_transpose(r1cs.c, lag))
    got = dev._qap_columns(r1cs, toxic, dev._domain_log(r1cs))
    for name, x, y in zip("uvk", got, (u, v, k)):
        assert np.array_equal(x, y), name


def test_lagrange_values_equal_the_broadcast_formula() -> None:
    tau = _toxic(9).tau
    xs = fr.powers(fr_root_of_unity(6), 64)
    tau_vec = np.broadcast_to(fr.const(tau), xs.shape).copy()
    want = fr.scale(fr.mul(xs, fr.batch_inverse(fr.sub(tau_vec, xs))), (pow(tau, 64, R_MOD) - 1) * pow(64, -1, R_MOD))
    assert np.array_equal(dev.lagrange_values(tau, 64, xs), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_coefficients_equal_the_scatter(seed: int) -> None:
    r1cs = _r1cs(seed)
    want = _coefs_by_scatter(r1cs)
    got = dev.snarkjs_coefs(r1cs)
    assert got.tobytes() == want.tobytes()
    for rows in (1, 3, 64, r1cs.n_constraints + 1):
        chunks = list(dev.coef_chunks(r1cs, rows))
        assert len(chunks) == -(-r1cs.n_constraints // rows) + 1
        assert np.concatenate(chunks).tobytes() == want.tobytes(), rows


@pytest.fixture(scope="module")
def backend() -> CpuBackend:
    return CpuBackend(threads=2)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_streamed_setup_file_is_byte_identical(seed: int, backend: CpuBackend, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """setup_file (sections made while written) against write_zkey of the in-memory key, same toxic waste;
    the chunked coefficient section across several chunks (COEF_CHUNK_ROWS lowered)."""
    r1cs, toxic = _r1cs(seed, repeats=False), _toxic(seed)
    write_r1cs(tmp_path / "c.r1cs", r1cs)
    write_zkey(tmp_path / "eager.zkey", dev.setup(r1cs, backend, toxic=toxic))
    made: list[int] = []
    chunks = dev.coef_chunks

    def counted(r1cs: R1CS, rows: int | None = None) -> Iterator[np.ndarray]:
        for chunk in chunks(r1cs, rows):
            made.append(chunk.shape[0])
            yield chunk

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger="cuzk_mp.groth16.setup"):
        mp.setattr(dev, "COEF_CHUNK_ROWS", 16)
        mp.setattr(dev, "coef_chunks", counted)
        dev.setup_file(tmp_path / "c.r1cs", tmp_path / "streamed.zkey", backend, toxic=toxic)
    assert len(made) == -(-r1cs.n_constraints // 16) + 1 and sum(made) == dev.snarkjs_coefs(r1cs).shape[0]
    assert (tmp_path / "streamed.zkey").read_bytes() == (tmp_path / "eager.zkey").read_bytes()
    messages = [r.getMessage() for r in caplog.records]
    for step in ("reading", "the QAP at tau", "the coefficient section", "the H scalars"):
        assert any(step in m and m.endswith(" ...") for m in messages), (step, messages)
        assert any(step in m and " in " in m and m.endswith(" s") for m in messages), (step, messages)
    with read_zkey(tmp_path / "streamed.zkey") as zkey:
        assert zkey.coefs.shape[0] == r1cs.a.nnz + r1cs.b.nnz + r1cs.n_public + 1


def test_setup_logs_its_host_steps(caplog: pytest.LogCaptureFixture, backend: CpuBackend) -> None:
    with caplog.at_level(logging.INFO, logger="cuzk_mp.groth16.setup"):
        dev.setup(_r1cs(1), backend, toxic=_toxic(1), name="k1")
    messages = [r.getMessage() for r in caplog.records]
    for step in ("the QAP at tau", "the coefficient section", "the H scalars"):
        assert f"setup k1: {step} ..." in messages
        assert any(m.startswith(f"setup k1: {step} in ") for m in messages), messages


def test_stream_with_wrong_rows_fails_and_leaves_no_file(backend: CpuBackend, tmp_path: Path) -> None:
    key = dev.setup(_r1cs(2), backend, toxic=_toxic(2))
    short = key.a[:-1] if len(key.a) > 1 else [key.a[0][:-1]]
    key.a = ChunkStream(key.n_vars, iter(short))  # type: ignore[assignment]
    with pytest.raises(ValueError, match="zkey.a stream had"):
        write_zkey(tmp_path / "bad.zkey", key)
    assert list(tmp_path.iterdir()) == []
    key.a = ChunkStream(key.n_vars + 1, iter(short))  # type: ignore[assignment]
    with pytest.raises(ValueError, match="declares"):
        write_zkey(tmp_path / "bad.zkey", key)
    key.a = ChunkStream(key.n_vars, iter([np.zeros((key.n_vars, 24), np.uint64)]))  # type: ignore[assignment]
    with pytest.raises(ValueError, match="chunk 0"):
        write_zkey(tmp_path / "bad.zkey", key)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("log_n", [1, 3, 6])
def test_h_scalars_equal_the_separate_passes(log_n: int) -> None:
    toxic = _toxic(log_n)
    n = 1 << log_n
    odd = fr.powers(fr_root_of_unity(log_n), n, start=fr_root_of_unity(log_n + 1))
    want = fr.from_mont(fr.scale(dev.lagrange_values(toxic.tau, 2 * n, odd), pow(toxic.delta, -1, R_MOD)))
    assert np.array_equal(dev.h_scalars(toxic, log_n), want)


@pytest.mark.parametrize("n", [0, 1, 5, 1023, 1025, 70_000])
def test_geometric_ratios_equal_the_separate_passes(n: int) -> None:
    """Chunk edges (chunks of 1024 and more), both output forms, and tau on a point refused."""
    rng = random.Random(n)
    tau, factor, w, start = (rng.randrange(1, R_MOD) for _ in range(4))
    xs = fr.powers(w, n, start=start)
    want = fr.scale(fr.mul(xs, fr.batch_inverse(fr.sub(np.broadcast_to(fr.const(tau), xs.shape).copy(), xs))), factor)
    assert np.array_equal(fr.geometric_ratios(tau, factor, w, start, n), want)
    assert np.array_equal(fr.geometric_ratios(tau, factor, w, start, n, mont=False), fr.from_mont(want))
    if n:
        with pytest.raises(ValueError, match="tau is one of the points"):
            fr.geometric_ratios(start * pow(w, n - 1, R_MOD) % R_MOD, factor, w, start, n)
