"""The witness map: a witness w -> the constraint evaluations (a, b, c) the prover needs.

a = A w and b = B w come from the zkey's coefficient section (values v R^2, so
with a standard-form witness the products come out in Montgomery form; rows
past the constraints are 0 except the extra "public input" rows snarkjs adds),
and c = a o b (snarkjs ``buildABC``). snarkjs never looks at C, so a witness
that breaks a constraint would silently give an invalid proof; when the
circuit's .r1cs is at hand we compute C w as well and refuse the witness,
naming the first constraint it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algebra import fr
from ..algebra.field import R_MOD, limbs_to_ints
from ..algebra.sparse import CsrMatrix
from ..backends.base import ProverInputs
from ..errors import InputError, UnsatisfiedWitness
from ..formats.r1cs import R1CS, read_r1cs
from ..formats.zkey import ZKey, coef_matrices, read_zkey

CHECK_BLOCK_ROWS = 1 << 14  # rows of C w computed at a time by the witness check


@dataclass
class ConstraintEvaluator:
    """Evaluates witnesses for one proving key (and, optionally, checks them against its r1cs)."""

    a: CsrMatrix  # domain_size rows, v R^2 coefficients
    b: CsrMatrix
    c_check: CsrMatrix | None  # n_constraints rows, v R^2 coefficients (from the r1cs)
    n_vars: int
    n_public: int
    domain_size: int
    n_constraints: int | None
    name: str

    @classmethod
    def from_zkey(cls, zkey: ZKey, r1cs: R1CS | None = None) -> ConstraintEvaluator:
        """Build from a zkey's section 4; with ``r1cs`` also check it belongs to the same circuit."""
        a, b = coef_matrices(zkey)
        name = str(zkey.path or "zkey")
        if r1cs is None:
            return cls(a, b, None, zkey.n_vars, zkey.n_public, zkey.domain_size, None, name)
        where = f"{r1cs.path or 'r1cs'} does not match {name}"
        if r1cs.n_wires != zkey.n_vars or r1cs.n_public != zkey.n_public:
            raise InputError(f"{where}: r1cs has {r1cs.n_wires} wires / {r1cs.n_public} public, "
                             f"zkey has {zkey.n_vars} / {zkey.n_public}")
        if r1cs.n_constraints + r1cs.n_public + 1 > zkey.domain_size:
            raise InputError(f"{where}: {r1cs.n_constraints} constraints do not fit the domain of {zkey.domain_size}")
        if a.nnz != r1cs.a.nnz + r1cs.n_public + 1 or b.nnz != r1cs.b.nnz:
            raise InputError(f"{where}: coefficient counts differ (zkey A/B {a.nnz}/{b.nnz}, "
                             f"r1cs A/B {r1cs.a.nnz}/{r1cs.b.nnz} + {r1cs.n_public + 1} public rows)")
        return cls(a, b, r1cs.c.to_r2_form(), zkey.n_vars, zkey.n_public, zkey.domain_size, r1cs.n_constraints, name)

    @classmethod
    def from_files(cls, zkey_path: str, r1cs_path: str | None) -> ConstraintEvaluator:
        """Build from a zkey file and, for the witness check, the circuit's r1cs file."""
        zkey = read_zkey(zkey_path)
        try:
            return cls.from_zkey(zkey, read_r1cs(r1cs_path) if r1cs_path else None)
        finally:
            zkey.close()

    @property
    def slot_bytes(self) -> int:
        """Bytes of one partition's a, b, c and w (the ring slot size)."""
        return (3 * self.domain_size + self.n_vars) * 32

    def validate_witness(self, w: np.ndarray) -> np.ndarray:
        """Shape, range and w[0] = 1 checks; returns a contiguous (n_vars, 4) uint64 array."""
        if not isinstance(w, np.ndarray) or w.dtype != np.uint64 or w.ndim != 2 or w.shape[1] != 4:
            raise InputError(f"witness must be an (n, 4) uint64 array, got {getattr(w, 'dtype', type(w))}")
        if w.shape[0] != self.n_vars:
            raise InputError(f"witness has {w.shape[0]} values, the circuit ({self.name}) has {self.n_vars} wires")
        bad = fr.first_noncanonical(w)
        if bad >= 0:
            raise InputError(f"witness value {bad} is not a field element (>= r)")
        if limbs_to_ints(w[0])[0] != 1:
            raise InputError("witness value 0 must be 1 (the constant wire)")
        return np.ascontiguousarray(w)

    def evaluate(self, w: np.ndarray) -> ProverInputs:
        """a, b, c (Montgomery) and w for the prover; raises UnsatisfiedWitness when checked and broken."""
        w = self.validate_witness(w)
        a, b, c = (np.empty((self.domain_size, 4), dtype=np.uint64) for _ in range(3))
        self.evaluate_into(w, a, b, c, threads=1)
        return ProverInputs(a=a, b=b, c=c, w=w)

    def evaluate_into(self, w: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, *, threads: int = 1) -> None:
        """Write A w, B w and a o b into ``a``, ``b``, ``c`` (``(domain_size, 4)`` uint64 views, e.g. a
        ring slot's); raises UnsatisfiedWitness when checked and broken. ``threads`` is the number of
        cores this partition may use (the worker process's numba threads already are that many)."""
        w = self.validate_witness(w)
        for name, out in (("a", a), ("b", b), ("c", c)):
            if not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.shape != (self.domain_size, 4):
                raise InputError(f"evaluate_into: {name} must be a ({self.domain_size}, 4) uint64 array")
        for m, out in ((self.a, a), (self.b, b)):
            fr._csr_matvec(m.indptr, m.indices, m.data, w, out)
        fr.mul_into(a, b, c)
        if self.c_check is not None:
            self._check(w, c)

    def _check(self, w: np.ndarray, ab: np.ndarray) -> None:
        """C w == a o b on every constraint, a block of rows at a time (C w is never held whole)."""
        m = self.c_check
        assert m is not None
        cw = np.empty((min(CHECK_BLOCK_ROWS, max(m.n_rows, 1)), 4), dtype=np.uint64)
        first: tuple[int, np.ndarray] | None = None
        failing = 0
        for lo in range(0, m.n_rows, CHECK_BLOCK_ROWS):
            hi = min(m.n_rows, lo + CHECK_BLOCK_ROWS)
            part = cw[: hi - lo]
            fr._csr_matvec(m.indptr[lo : hi + 1], m.indices, m.data, w, part)
            bad = np.flatnonzero((ab[lo:hi] != part).any(axis=1))
            if bad.size and first is None:
                first = (lo + int(bad[0]), part[bad[0] : bad[0] + 1].copy())
            failing += int(bad.size)
        if first is not None:
            i, rhs_row = first
            lhs, rhs = fr.to_ints(ab[i : i + 1])[0], fr.to_ints(rhs_row)[0]
            raise UnsatisfiedWitness(
                i,
                f"witness does not satisfy constraint {i} of {self.n_constraints} "
                f"({failing} constraint(s) fail in all): <A,w>*<B,w> = {lhs} but <C,w> = {rhs} "
                f"(difference {(lhs - rhs) % R_MOD})",
            )
