"""The dense-random synthetic circuit: every witness value a full-width field element.

The counterpart of :class:`~cuzk_mp.circuits.synthetic.PorepLike` for the other end of the
benchmark range (a witness of full-width random field elements): with it no MSM can
skip zeros or add ones, so a prove measures full Pippenger passes. It has the same interface as
``PorepLike`` (``r1cs()``, ``witness(seed, partition)``, ``witness_into``, ``public_inputs``) and
the same sizing rule: exactly ``2^log_n - n_public - 1`` constraints, so that snarkjs's domain is
``2^log_n``.

Layout (circom's wire order): wire 0 = 1, the ``n_public - 1`` public outputs, the public
partition index, then the chain ``v_0 .. v_{m-1}``. ``L`` independent lanes interleave: the first
``2L`` chain values are random inputs drawn from (seed, partition), and for ``i >= 2L``

    (v[i-2L] + alpha_i [+ partition if i == 2L]) * (v[i-L] + beta_i) = v[i]

with small constants ``alpha_i = 1 + i mod 251`` and ``beta_i = 2 + i mod 241``; the last rows bind
the outputs, ``v[m-1-j] * 1 = out_j``. So the wires number ``2^log_n + 2L`` or so (about one per
row, like PorepLike), each row has 2 (A), 2 (B) and 1 (C) entries, and the lanes make the witness a
parallel loop (numba, one lane per iteration).
"""

from __future__ import annotations

from functools import cache, cached_property

import numpy as np

from ..algebra import fr, fr_kernels
from ..algebra.field import R_MOD
from ..algebra.jit import njit, prange
from ..algebra.sparse import CsrMatrix
from ..algebra.threads import numba_threads
from ..errors import InputError
from ..formats.r1cs import R1CS
from .synthetic_shape import check_shape

ALPHA_PERIOD, BETA_PERIOD = 251, 241
PARTITION_LIMIT = 1 << 32

_fadd, _fmul, _fredc = fr_kernels.fadd, fr_kernels.fmul, fr_kernels.fredc


def _lanes(log_n: int) -> int:
    """Lanes of the chain: 2^(log_n - 6), at most 1024 (so there are at least 64 steps per lane)."""
    return min(1024, 1 << (log_n - 6))


@njit(parallel=True, nogil=True, cache=True)
def _chain(v, lanes, alpha, beta, p):  # type: ignore[no-untyped-def]
    """v[i] = (v[i-2L] + alpha[i % 251] (+ p at i = 2L)) * (v[i-L] + beta[i % 241]) over Montgomery forms.

    ``v[:2L]`` holds the inputs (read as Montgomery forms); every v[i] is written in standard
    form. A lane's two previous values stay in registers, so each row is read never and
    written once (one pass, lane-parallel).
    """
    m = v.shape[0]
    na, nb = alpha.shape[0], beta.shape[0]
    for lane in prange(lanes):
        u0, u1, u2, u3 = v[lane, 0], v[lane, 1], v[lane, 2], v[lane, 3]  # v[i - 2L]
        t0, t1, t2, t3 = v[lane + lanes, 0], v[lane + lanes, 1], v[lane + lanes, 2], v[lane + lanes, 3]  # v[i - L]
        v[lane, 0], v[lane, 1], v[lane, 2], v[lane, 3] = _fredc(u0, u1, u2, u3)
        v[lane + lanes, 0], v[lane + lanes, 1], v[lane + lanes, 2], v[lane + lanes, 3] = _fredc(t0, t1, t2, t3)
        i = lane + 2 * lanes
        while i < m:
            ka, kb = i % na, i % nb
            x0, x1, x2, x3 = _fadd(u0, u1, u2, u3, alpha[ka, 0], alpha[ka, 1], alpha[ka, 2], alpha[ka, 3])
            if i == 2 * lanes:
                x0, x1, x2, x3 = _fadd(x0, x1, x2, x3, p[0], p[1], p[2], p[3])
            y0, y1, y2, y3 = _fadd(t0, t1, t2, t3, beta[kb, 0], beta[kb, 1], beta[kb, 2], beta[kb, 3])
            u0, u1, u2, u3 = t0, t1, t2, t3
            t0, t1, t2, t3 = _fmul(x0, x1, x2, x3, y0, y1, y2, y3)
            v[i, 0], v[i, 1], v[i, 2], v[i, 3] = _fredc(t0, t1, t2, t3)
            i += lanes


@cache
def _row_constants() -> tuple[np.ndarray, np.ndarray]:
    """alpha_k = 1 + k and beta_k = 2 + k in Montgomery form (the r1cs writes them standard)."""
    return fr.from_ints(list(range(1, 1 + ALPHA_PERIOD))), fr.from_ints(list(range(2, 2 + BETA_PERIOD)))


def _std(values: np.ndarray) -> np.ndarray:
    """Small non-negative ints -> ``(n, 4)`` standard-form coefficient rows."""
    out = np.zeros((values.shape[0], 4), dtype=np.uint64)
    out[:, 0] = values
    return out


class DenseRandom:
    """The dense-random synthetic circuit with 2^log_n rows and ``n_public`` public signals."""

    def __init__(self, log_n: int, n_public: int = 4) -> None:
        check_shape("dense-random", log_n, n_public)
        self.log_n = log_n
        self.domain_size = 1 << log_n
        self.n_public = n_public
        self.n_pub_out = n_public - 1
        self.n_constraints = self.domain_size - n_public - 1
        self.partition_wire = n_public
        self.lanes = _lanes(log_n)
        self.base = 1 + n_public  # wire of v_0
        self.m = self.n_constraints - self.n_pub_out + 2 * self.lanes  # chain values
        self.n_wires = self.base + self.m

    # ------------------------------------------------------------------ constraint system

    def r1cs(self) -> R1CS:
        """The circuit's R1CS (standard-form coefficients), built on first use and cached."""
        return self._r1cs

    @cached_property
    def _r1cs(self) -> R1CS:
        L, m, base, n_out = self.lanes, self.m, self.base, self.n_pub_out
        i = np.arange(2 * L, m, dtype=np.int64)  # chain rows, in row order
        rows = i.shape[0]
        one = np.ones(rows, dtype=np.int64)
        # A: [one: alpha_i, (row 0: partition: 1), v[i-2L]: 1]  B: [one: beta_i, v[i-L]: 1]  C: [v[i]: 1]
        a_cols = np.stack([np.zeros(rows, dtype=np.int64), base + i - 2 * L], axis=1)
        a_vals = np.stack([1 + i % ALPHA_PERIOD, one], axis=1)
        b_cols = np.stack([np.zeros(rows, dtype=np.int64), base + i - L], axis=1)
        b_vals = np.stack([2 + i % BETA_PERIOD, one], axis=1)
        out_v = base + m - 1 - np.arange(n_out, dtype=np.int64)  # v[m-1-j] * 1 = out_j
        outs = np.arange(1, 1 + n_out, dtype=np.int64)
        a = self._csr([[0, self.partition_wire, int(a_cols[0, 1])]], [[int(a_vals[0, 0]), 1, 1]],
                      a_cols[1:], a_vals[1:], out_v[:, None], np.ones((n_out, 1), dtype=np.int64))
        b = self._csr([], [], b_cols, b_vals, np.zeros((n_out, 1), dtype=np.int64), np.ones((n_out, 1), dtype=np.int64))
        c = self._csr([], [], (base + i)[:, None], one[:, None], outs[:, None], np.ones((n_out, 1), dtype=np.int64))
        return R1CS(prime=R_MOD, n_wires=self.n_wires, n_pub_out=n_out, n_pub_in=1, n_prv_in=0,
                    n_labels=self.n_wires, n_constraints=self.n_constraints, a=a, b=b, c=c,
                    wire_to_label=None, path=None)

    def _csr(self, head_cols: list[list[int]], head_vals: list[list[int]], cols: np.ndarray, vals: np.ndarray,
             tail_cols: np.ndarray, tail_vals: np.ndarray) -> CsrMatrix:
        """Rows: the ragged ``head`` rows, then fixed-width ``cols``/``vals`` rows, then ``tail`` rows."""
        counts = [len(r) for r in head_cols] + [cols.shape[1]] * cols.shape[0] + [tail_cols.shape[1]] * tail_cols.shape[0]
        indptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        flat_cols = np.concatenate([np.array([c for r in head_cols for c in r], dtype=np.int64),
                                    cols.ravel(), tail_cols.ravel()])
        flat_vals = np.concatenate([np.array([v for r in head_vals for v in r], dtype=np.int64),
                                    vals.ravel(), tail_vals.ravel()])
        assert indptr[-1] == flat_cols.shape[0] and len(counts) == self.n_constraints
        return CsrMatrix(indptr=indptr, indices=flat_cols.astype(np.uint32), data=_std(flat_vals.astype(np.uint64)),
                         n_cols=self.n_wires)

    # ------------------------------------------------------------------ witness

    def witness(self, seed: int, partition: int) -> np.ndarray:
        """The witness for (seed, partition): ``(n_wires, 4)`` uint64, standard form."""
        out = np.empty((self.n_wires, 4), dtype=np.uint64)
        self.witness_into(seed, partition, out)
        return out

    def witness_into(self, seed: int, partition: int, out: np.ndarray, threads: int = 1) -> None:
        """Write the witness for (seed, partition) into ``out`` (``(n_wires, 4)`` uint64, e.g. a shm view).

        Uses ``threads`` cores (chain lanes in parallel); the bytes are the same for any count.
        """
        if not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.shape != (self.n_wires, 4):
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise InputError(f"dense-random 2^{self.log_n}: witness_into needs a ({self.n_wires}, 4) uint64 array, "
                             f"got {got}")
        partition = self._check(seed, partition)
        v = out[self.base :]
        v[: 2 * self.lanes] = self.chain_inputs(seed, partition)  # read as Montgomery representatives
        with numba_threads(threads):
            _chain(v, self.lanes, *_row_constants(), fr.const(partition))
        out[: self.base] = 0
        out[0, 0] = 1
        out[1 : 1 + self.n_pub_out] = v[self.m - 1 - np.arange(self.n_pub_out)]
        out[self.partition_wire, 0] = partition

    def public_inputs(self, seed: int, partition: int) -> list[int]:
        """The public signals w[1..n_public] (outputs, then the partition index), as snarkjs lists them."""
        return fr.to_ints(self.witness(seed, partition)[1 : 1 + self.n_public], mont=False)

    def chain_inputs(self, seed: int, partition: int) -> np.ndarray:
        """The 2L random chain inputs: four PCG64 words, the top one cut to 62 bits (< 2^254 < r)."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, partition, 0xD5])))
        x = rng.integers(0, 1 << 64, size=(2 * self.lanes, 4), dtype=np.uint64)
        x[:, 3] >>= np.uint64(2)
        return x

    def _check(self, seed: int, partition: int) -> int:
        if seed < 0:
            raise InputError(f"dense-random: seed must be >= 0, got {seed}")
        if not 0 <= partition < PARTITION_LIMIT:
            raise InputError(f"dense-random: partition index must be in [0, 2^32), got {partition}")
        return int(partition)

