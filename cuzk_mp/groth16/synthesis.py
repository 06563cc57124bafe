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
from ..formats.r1cs import R1CS
from ..formats.zkey import ZKey, coef_matrices


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
        a = self.a.matvec(w)
        b = self.b.matvec(w)
        c = fr.mul(a, b)
        if self.c_check is not None:
            self._check(w, c)
        return ProverInputs(a=a, b=b, c=c, w=w)

    def _check(self, w: np.ndarray, ab: np.ndarray) -> None:
        cw = self.c_check.matvec(w)  # type: ignore[union-attr]
        m = cw.shape[0]
        bad = np.flatnonzero((ab[:m] != cw).any(axis=1))
        if bad.size:
            i = int(bad[0])
            lhs, rhs = fr.to_ints(ab[i : i + 1])[0], fr.to_ints(cw[i : i + 1])[0]
            raise UnsatisfiedWitness(
                i,
                f"witness does not satisfy constraint {i} of {self.n_constraints} "
                f"({len(bad)} constraint(s) fail in all): <A,w>*<B,w> = {lhs} but <C,w> = {rhs} "
                f"(difference {(lhs - rhs) % R_MOD})",
            )
