"""The witness map: a witness w -> the constraint evaluations (a, b, c) the prover needs.

a = A w and b = B w come from the zkey's coefficient section (values v R^2, so
with a standard-form witness the products come out in Montgomery form; rows
past the constraints are 0 except the extra "public input" rows snarkjs adds),
and c = a o b (snarkjs ``buildABC``). snarkjs never looks at C, so a witness
that breaks a constraint would silently give an invalid proof; when the
circuit's .r1cs is at hand we compare C w with a o b as well and refuse the
witness, naming the first constraint it breaks.

The matrices are the circuit's compact, shared data (:mod:`.circuit_data`):
:meth:`ConstraintEvaluator.from_files` maps the read-only cache file that every
worker shares (building it once), :meth:`ConstraintEvaluator.from_zkey` builds
the same arrays in memory. :meth:`ConstraintEvaluator.evaluate_into` writes a,
b, c straight into the caller's arrays (a ring slot) with ``threads`` cores,
block by block (:func:`cuzk_mp.algebra.coded_sparse.evaluate_rows_into`): its
private memory is a few bytes per row block, and its bytes are the same for any
thread count.
"""

from __future__ import annotations

import os

import numpy as np

from ..algebra import fr
from ..algebra.coded_sparse import evaluate_rows_into
from ..algebra.field import R_MOD, limbs_to_ints
from ..algebra.threads import numba_threads
from ..backends.base import ProverInputs
from ..errors import InputError, UnsatisfiedWitness
from ..formats.r1cs import R1CS
from ..formats.zkey import ZKey
from .circuit_data import build_in_memory, open_or_build
from .circuit_data_file import CircuitData


class ConstraintEvaluator:
    """Evaluates witnesses for one proving key (and, with its r1cs, checks them)."""

    def __init__(self, data: CircuitData, name: str) -> None:
        self.data = data
        self.name = name
        counts = data.counts
        self.n_vars = counts.n_vars
        self.n_public = counts.n_public
        self.domain_size = counts.domain_size
        self.n_constraints: int | None = counts.n_constraints if counts.has_c else None

    @classmethod
    def from_files(cls, zkey_path: str, r1cs_path: str | None, *, cache_dir: str | None = None) -> ConstraintEvaluator:
        """Map the circuit's shared data (built once, beside the key or in the cache directory).

        Only the headers of the key and r1cs are read when a valid cache exists; with ``r1cs_path``
        witnesses are checked.
        """
        return cls(open_or_build(zkey_path, r1cs_path, cache_dir), os.fspath(zkey_path))

    @classmethod
    def from_zkey(cls, zkey: ZKey, r1cs: R1CS | None = None) -> ConstraintEvaluator:
        """Build from a zkey's section 4 in memory; with ``r1cs`` also check it belongs to the same circuit."""
        return cls(build_in_memory(zkey, r1cs), str(zkey.path or "zkey"))

    @property
    def slot_bytes(self) -> int:
        """Bytes of one partition's a, b, c and w (the ring slot size)."""
        return (3 * self.domain_size + self.n_vars) * 32

    def close(self) -> None:
        """Drop the circuit data (its mapping goes when the last view of it does)."""
        self.data.close()

    def validate_witness(self, w: np.ndarray) -> np.ndarray:
        """Shape, range and w[0] = 1 checks; returns a contiguous (n_vars, 4) uint64 array."""
        self._check_witness(w)
        return np.ascontiguousarray(w)

    def _check_witness(self, w: np.ndarray) -> None:
        if not isinstance(w, np.ndarray) or w.dtype != np.uint64 or w.ndim != 2 or w.shape[1] != 4:
            raise InputError(f"witness must be an (n, 4) uint64 array, got {getattr(w, 'dtype', type(w))}")
        if w.shape[0] != self.n_vars:
            raise InputError(f"witness has {w.shape[0]} values, the circuit ({self.name}) has {self.n_vars} wires")
        bad = fr.first_noncanonical(w)
        if bad >= 0:
            raise InputError(f"witness value {bad} is not a field element (>= r)")
        if limbs_to_ints(w[0])[0] != 1:
            raise InputError("witness value 0 must be 1 (the constant wire)")

    def evaluate(self, w: np.ndarray) -> ProverInputs:
        """a, b, c (Montgomery) and w for the prover in new arrays, on every pool thread."""
        w = self.validate_witness(w)
        a, b, c = (np.empty((self.domain_size, 4), dtype=np.uint64) for _ in range(3))
        self.evaluate_into(w, a, b, c, threads=os.cpu_count() or 1)
        return ProverInputs(a=a, b=b, c=c, w=w)

    def evaluate_into(self, w: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, *, threads: int) -> None:
        """Write a = A w, b = B w, c = a o b into the given ``(domain_size, 4) uint64`` arrays (e.g. shm views).

        Uses ``threads`` cores (clamped to numba's pool); the bytes do not depend on it. With the
        r1cs, raises UnsatisfiedWitness naming the first failing constraint (a, b, c are written).
        """
        for label, out in (("a", a), ("b", b), ("c", c)):
            if not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.shape != (self.domain_size, 4):
                got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
                raise InputError(f"evaluate_into: {label} must be a ({self.domain_size}, 4) uint64 array, got {got}")
            if not out.flags.writeable:
                raise InputError(f"evaluate_into: {label} is read-only")
        d = self.data
        with numba_threads(threads):
            self._check_witness(w)
            first, n_bad = evaluate_rows_into(d.a, d.b, d.c, d.table_mont, d.table_r2, w, a, b, c)
        if first >= 0:
            self._unsatisfied(w, c, first, n_bad)

    def _unsatisfied(self, w: np.ndarray, ab: np.ndarray, i: int, n_bad: int) -> None:
        cm = self.data.c
        assert cm is not None
        p0, p1 = int(cm.indptr[i]), int(cm.indptr[i + 1])
        coefs = fr.to_ints(np.ascontiguousarray(self.data.table_mont[cm.codes[p0:p1]]))  # v R -> v
        values = limbs_to_ints(np.ascontiguousarray(w[cm.cols[p0:p1]]))
        lhs, rhs = fr.to_ints(ab[i : i + 1])[0], sum(v * x for v, x in zip(coefs, values)) % R_MOD
        raise UnsatisfiedWitness(
            i,
            f"witness does not satisfy constraint {i} of {self.n_constraints} "
            f"({n_bad} constraint(s) fail in all): <A,w>*<B,w> = {lhs} but <C,w> = {rhs} "
            f"(difference {(lhs - rhs) % R_MOD})",
        )


def warm_up() -> None:
    """Load (or, the first time on a machine, compile: about half a minute) the synthesis kernels.

    A worker calls it before it reports ready, so its first partition is not slowed down.
    """
    from .synthesis_key import tiny_zkey_and_r1cs  # here: it imports the setup, which a prove needs not

    zkey, r1cs = tiny_zkey_and_r1cs()
    ev = ConstraintEvaluator.from_zkey(zkey, r1cs)
    w = np.zeros((ev.n_vars, 4), dtype=np.uint64)
    w[0, 0] = 1
    a, b, c = (np.empty((ev.domain_size, 4), dtype=np.uint64) for _ in range(3))
    ev.evaluate_into(w, a, b, c, threads=1)
