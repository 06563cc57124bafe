"""The backend interface the Groth16 recipe is written against (docs/backend-protocol.md).

A backend owns where the numbers live (host memory, or a GPU) and how the heavy
steps run: the coset evaluation of H, the MSM of a key section with given
scalars, and batch fixed-base scalar multiplication for the dev setup. Which
scalars each of the five MSMs takes is the recipe's business
(:func:`cuzk_mp.groth16.prover.prove_start`), written once there. A backend
makes no policy decisions: scheduling lives in :mod:`cuzk_mp.pipeline`.

Data layouts shared by every backend (docs/architecture.md, "Conventions"):

* Fr vectors: ``(n, 4) uint64`` little-endian limbs. ``a, b, c`` are in
  Montgomery form (what ``coefs(v R^2) x witness(standard)`` yields); the
  witness ``w`` and MSM scalars are in standard form.
* G1 points: ``(n, 12) uint64`` = x (6 limbs) then y (6 limbs), each coordinate
  in Montgomery form (x R mod q): the zkey's byte layout, so a zkey section can
  be uploaded as is. The point at infinity is all zeros.
* G2 points: ``(n, 24) uint64`` = x.c0, x.c1, y.c0, y.c1 (6 limbs each, Montgomery).
* Single result points are py_arkworks_bls12381 ``G1Point`` / ``G2Point``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ..errors import InputError
from ..formats.zkey import ZKey

if TYPE_CHECKING:
    from ..algebra.coded_sparse import CodedMatrix


@dataclass
class ProverInputs:
    """One partition, ready for the device: what synthesis produces.

    ``a``, ``b``, ``c`` have ``domain_size`` rows (Montgomery form; rows past
    the constraints are 0); ``w`` has ``n_vars`` rows (standard form).
    """

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    w: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of the four vectors."""
        return int(self.a.nbytes + self.b.nbytes + self.c.nbytes + self.w.nbytes)


@dataclass
class MsmSums:
    """The five multi-scalar multiplications of one proof (snarkjs prover step 5).

    a  = sum_i w_i A_i            (zkey section 5, G1)
    b1 = sum_i w_i B1_i           (section 6, G1)
    b2 = sum_i w_i B2_i           (section 7, G2)
    c  = sum_{i>nPublic} w_i C_i  (section 8, G1)
    h  = sum_j p_j H_j            (section 9, G1), p = odd-coset values of A*B - C
    """

    a: G1Point
    b1: G1Point
    b2: G2Point
    c: G1Point
    h: G1Point


SECTIONS = ("a", "b1", "b2", "c", "h")  # zkey sections 5, 6, 7 (G2), 8 and 9
G2_ROW_COST = 3  # a G2 fixed-base row costs about three G1 rows (Fq2 arithmetic): for progress and ETAs


class KeyHandle(Protocol):
    """A proving key made resident in a backend (SRS points on the device, etc.)."""

    zkey: ZKey
    nbytes: int

    def close(self) -> None:
        """Release what the backend holds for this key."""


class WitnessRows(Protocol):
    """The coded A and B rows of a circuit and their coefficient table (the shared circuit data,
    :class:`cuzk_mp.groth16.circuit_data_file.CircuitData`): what the witness map reads."""

    a: CodedMatrix
    b: CodedMatrix
    table_mont: np.ndarray  # (n_codes, 4): v R
    table_r2: np.ndarray  # (n_codes, 4): v R^2


class Staged(Protocol):
    """A partition copied into backend memory; ``w`` is the witness as a backend-resident Vector.

    A Vector is ``numpy.ndarray`` on the CPU and ``cupy.ndarray`` on the GPU, ``(rows, 4)``
    uint64 in standard form; it supports row slicing (``w[k:]``).
    """

    w: Any


@runtime_checkable
class Backend(Protocol):
    """What the Groth16 recipe needs from a compute backend."""

    name: str  # "cpu" | "gpu"
    busy_seconds: float  # accumulated device-busy seconds (CUDA events on the GPU)
    last_timings: dict[str, float]  # ms per backend stage of the last partition (the backend's own split)
    # True where h_values and msm only enqueue device work: the recipe then starts the H chain (the H
    # step, then its MSM: the longest dependent chain of a small proof) right after G2, not after the
    # witness MSMs (a backend that computes H on the calling thread wants those submitted first)
    h_early: bool
    # True where :meth:`stage_witness` computes a, b, c from w where the partition is kept (the GPU):
    # a one-shot proof then copies only w, and the host does no witness map
    witness_on_device: bool
    # The most partitions a caller may stage at once on one thread (a prover worker's batch), where the
    # backend's memory plan caps it (the GPU: the smallest batch its loaded keys' device plans allow);
    # None: no cap (the CPU backend: the pipeline's host-memory model counts its batches)
    batch_limit: int | None = None

    def load_key(self, zkey: ZKey, *, lasting: bool = True, witness_rows: WitnessRows | None = None,
                 batch: int = 1) -> KeyHandle:
        """Make the key's point sections resident (idempotent per zkey path is the caller's job).

        ``lasting=False``: the key serves one proof and goes (a one-shot ``groth16 prove``), so
        set-up that only pays back over many proofs (the GPU's precomputed multiples) is skipped.
        ``witness_rows``: the circuit's coded rows when its partitions will come through
        :meth:`stage_witness` with this very object (where the backend keeps them beside the key, its
        memory plan counts them and it copies them while the key loads).
        ``batch``: the most partitions of this key the caller stages on one thread and computes
        together (its batch policy, given as a number: where the backend plans its memory it counts
        that many, and may lower :attr:`batch_limit`).
        """

    def generate_key(self, head: ZKey, sections: Sequence[tuple[str, str, Callable[[], np.ndarray]]], *,
                     lasting: bool = True, witness_rows: WitnessRows | None = None, batch: int = 1) -> KeyHandle:
        """Make a key resident from its sections' scalars, with no key file (the dev setup of
        :func:`cuzk_mp.groth16.setup_resident.setup_resident`): ``head`` is a :class:`ZKey` with
        its header points and sizes; each ``(section, "g1" | "g2", scalars)`` gives the section's
        standard-form scalars s_i, whose points s_i G (G the group's generator) the backend makes
        where it keeps keys, in the order given, dropping each section's scalars when done;
        ``witness_rows`` and ``batch`` as for :meth:`load_key`."""

    def stage_witness(self, key: KeyHandle, rows: WitnessRows, w: np.ndarray) -> Staged:
        """Stage a partition from its witness alone: copy ``w`` (validated: canonical, ``n_vars``
        rows) and compute a = A w, b = B w, c = a o b from the circuit's coded ``rows`` where the
        partition is kept (only where :attr:`witness_on_device`; NotImplementedError elsewhere).
        The same bytes as :meth:`cuzk_mp.groth16.synthesis.ConstraintEvaluator.evaluate`."""

    def stage(self, key: KeyHandle, inputs: ProverInputs) -> Staged:
        """Copy a, b, c, w into backend memory; on return the caller may free ``inputs`` (the ring slot).

        Raises :class:`cuzk_mp.errors.InputError` when the shapes do not match the key,
        :class:`cuzk_mp.errors.ResourceError` when the backend has no room.
        """

    def h_values(self, key: KeyHandle, staged: Staged) -> Any:
        """p[j] = (A*B - C)(w_2n^(2j+1)), standard form, domain_size rows, backend-resident.

        May reuse the staged a/b/c storage: a, b and c are dead afterwards.
        """

    def msm(self, key: KeyHandle, section: str, scalars: Any) -> Future[Any]:
        """sum_i scalars[i] * P_i over a key section ("a", "b1", "b2" (G2), "c" or "h").

        The number of scalars must equal the section's point count (else InputError naming
        both counts). Returns at once with a Future whose result is a py_arkworks_bls12381
        G1Point / G2Point; the backend may overlap MSMs (G2 on its own stream or thread).
        """

    def msm_batch(self, key: KeyHandle, section: str, scalars: Sequence[Any]) -> list[Future[Any]]:
        """The MSMs of k scalar vectors over the same key section, as one pass where the backend can.

        Each vector as in :meth:`msm`; returns k Futures in order. A backend without a batched
        kernel path enqueues them one after another (:func:`msm_each`).
        """

    def release(self, staged: Staged) -> dict[str, float]:
        """Free a staged partition's backend memory (idempotent); the backend's own split of the
        partition's device work, ms per stage (as :attr:`last_timings`; empty where it keeps none, and
        on a second call)."""

    def stats(self) -> dict[str, float]:
        """What the backend reports to its prover process's status: ``busy_seconds`` at least (the
        GPU backend adds what it holds of its keys on the device and on the host)."""

    # ---- primitives kept for tests and the dev setup (host numpy in, host out)
    def ntt(self, values: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Radix-2 NTT of a power-of-two length Montgomery Fr vector (natural order in and out)."""

    def coset_h(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """p[j] = (A*B - C)(w_2n^(2j+1)) as standard-form scalars (snarkjs prover steps 2-3)."""

    def msm_g1(self, points: np.ndarray, scalars: np.ndarray) -> G1Point:
        """sum_i scalars[i] * points[i] over G1; counts must match."""

    def msm_g2(self, points: np.ndarray, scalars: np.ndarray) -> G2Point:
        """sum_i scalars[i] * points[i] over G2; counts must match."""

    def fixed_base_g1(self, base: G1Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] as an ``(n, 12)`` zkey-layout array (dev setup)."""

    def fixed_base_g2(self, base: G2Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] as an ``(n, 24)`` zkey-layout array (dev setup)."""


def msm_each(backend: Any, key: Any, section: str, scalars: Sequence[Any]) -> list[Future[Any]]:
    """:meth:`Backend.msm_batch` as k separate MSMs (the fallback of a backend with no batched path)."""
    return [backend.msm(key, section, s) for s in scalars]


def check_scalar_count(section: str, n_points: int, n_scalars: int) -> None:
    """InputError naming both counts unless an MSM over ``section`` gets one scalar per point."""
    if n_points != n_scalars:
        raise InputError(f"MSM over key section {section!r}: {n_scalars} scalars for its {n_points} points")


def check_key_sections(names: Sequence[str]) -> None:
    """InputError unless ``generate_key`` got each of the five point sections exactly once."""
    if sorted(names) != sorted(SECTIONS):
        raise InputError(f"generate_key: sections {list(names)}, expected each of {list(SECTIONS)} once")
