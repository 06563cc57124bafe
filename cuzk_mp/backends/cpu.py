"""The CPU backend: numba for Fr work, arkworks (py_arkworks_bls12381) for the MSMs.

Keys are made resident as lists of arkworks point objects (conversion from the
zkey's Montgomery layout costs ~0.5 us/point, once per key). MSM scalars are
split three ways, as supraseal does on the GPU: zeros are dropped, points
whose scalar is 1 are summed with plain additions, and only the rest go
through arkworks' Pippenger. Every MSM is queued on a thread pool as balanced
pieces and returns a Future at once (arkworks releases the GIL), so the recipe
computes H on its own thread while the pool runs the witness MSMs.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from ..algebra import curve, ec, ntt
from ..errors import InputError
from ..formats.zkey import ZKey, section_error
from .base import SECTIONS, ProverInputs, WitnessRows, check_key_sections, check_scalar_count, msm_each


@dataclass
class CpuKey:
    """A zkey's point sections as arkworks objects."""

    zkey: ZKey
    a: list[G1Point]
    b1: list[G1Point]
    b2: list[G2Point]
    c: list[G1Point]
    h: list[G1Point]
    nbytes: int = 0

    def close(self) -> None:
        """Drop the point lists."""
        self.a = self.b1 = self.c = self.h = []
        self.b2 = []
        self.nbytes = 0


@dataclass
class CpuStaged:
    """A partition copied into this process's memory (the ring segment can go); None once consumed."""

    a: np.ndarray | None
    b: np.ndarray | None
    c: np.ndarray | None
    w: np.ndarray | None


def _scalar_objects(scalars: np.ndarray) -> list[Scalar]:
    data = np.ascontiguousarray(scalars, dtype="<u8").tobytes()
    make = Scalar.from_le_bytes
    return [make(data[i : i + 32]) for i in range(0, len(data), 32)]


def _split01(scalars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of scalars equal to 1, and of the other non-zero scalars."""
    nonzero = scalars.any(axis=1)
    ones = (scalars[:, 0] == 1) & ~scalars[:, 1:].any(axis=1)
    return np.flatnonzero(ones), np.flatnonzero(nonzero & ~ones)


def _check_sizes(points: Sequence[Any], scalars: np.ndarray) -> None:
    # arkworks' multiexp_unchecked silently truncates to the shorter list: refuse instead.
    if len(points) != scalars.shape[0]:
        raise ValueError(f"MSM size mismatch: {len(points)} points, {scalars.shape[0]} scalars")


def _combined(parts: list[Future[Any]]) -> Future[Any]:
    """A Future of the sum of the parts' results, set by the last part to finish (no thread waits)."""
    out: Future[Any] = Future()
    left = [len(parts)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            out.set_result(reduce(operator.add, (f.result() for f in parts)))
        except BaseException as exc:  # noqa: BLE001 - the caller sees it from result()
            out.set_exception(exc)

    for f in parts:
        f.add_done_callback(one_done)
    return out


def _sum_points(points: Sequence[Any], idx: np.ndarray, identity: Any) -> Any:
    acc = identity
    for i in idx.tolist():
        acc = acc + points[i]
    return acc


def _pippenger(points: Sequence[Any], scalars: np.ndarray, idx: np.ndarray, identity: Any) -> Any:
    if idx.size == 0:
        return identity
    return type(identity).multiexp_unchecked([points[i] for i in idx.tolist()], _scalar_objects(scalars[idx]))


def msm(points: Sequence[Any], scalars: np.ndarray, identity: Any) -> Any:
    """sum_i scalars[i] * points[i] with arkworks, skipping zeros and adding ones directly.

    ``points`` are arkworks objects, ``scalars`` an ``(n, 4)`` standard-form array.
    """
    _check_sizes(points, scalars)
    ones, rest = _split01(scalars)
    return _sum_points(points, ones, identity) + _pippenger(points, scalars, rest, identity)


MIN_CHUNK = 1 << 13  # below this, splitting a Pippenger across threads costs more than it saves


class CpuBackend:
    """Backend on the host CPU (see module docstring)."""

    name = "cpu"
    h_early = False  # H runs on the calling thread while the pool runs the witness MSMs
    witness_on_device = False  # the witness map is the host's (ConstraintEvaluator); stage takes a, b, c
    batch_limit: int | None = None  # no cap: the pipeline's host-memory model counts the prover's batches

    def __init__(self, threads: int | None = None) -> None:
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(max_workers=max(2, self.threads), thread_name_prefix="cuzk-cpu-msm")
        self.last_timings: dict[str, float] = {}
        self.busy_seconds = 0.0

    # ---- keys and partitions
    def load_key(self, zkey: ZKey, *, lasting: bool = True, witness_rows: WitnessRows | None = None,
                 batch: int = 1) -> CpuKey:
        """Convert sections 5..9 to arkworks objects (on the pool, G2 beside G1); ``lasting``,
        ``witness_rows`` and ``batch`` change nothing here (the conversion is what every proof needs;
        the host map reads the caller's mapping)."""
        def convert(name: str) -> list[Any]:
            try:
                return (curve.g2_lem_to_ark_list if name == "b2" else curve.g1_lem_to_ark_list)(getattr(zkey, name))
            except ValueError as exc:  # a point off its curve: the key file's fault, named
                raise section_error(zkey, name, str(exc)) from None

        g2 = self._pool.submit(convert, "b2")
        g1 = [convert(name) for name in ("a", "b1", "c", "h")]
        key = CpuKey(zkey, g1[0], g1[1], g2.result(), g1[2], g1[3])
        n_g1 = sum(len(x) for x in g1)
        key.nbytes = n_g1 * sys.getsizeof(G1Point()) + len(key.b2) * sys.getsizeof(G2Point()) + 8 * (n_g1 + len(key.b2))
        return key

    def generate_key(self, head: ZKey, sections: Sequence[tuple[str, str, Callable[[], np.ndarray]]], *,
                     lasting: bool = True, witness_rows: WitnessRows | None = None, batch: int = 1) -> CpuKey:
        """Each section's points by the numba fixed-base kernel (host memory), then :meth:`load_key`
        (``witness_rows``, ``batch``: nothing to plan, the host map reads the caller's mapping)."""
        check_key_sections([name for name, _, _ in sections])
        made: dict[str, np.ndarray] = {}
        for name, group, scalars in sections:
            made[name] = (self.fixed_base_g2(G2Point(), scalars()) if group == "g2"
                          else self.fixed_base_g1(G1Point(), scalars()))
        key = dataclasses.replace(head, a=made["a"], b1=made["b1"], b2=made["b2"], c=made["c"], h=made["h"])
        return self.load_key(key, lasting=lasting)

    def stage_witness(self, key: CpuKey, rows: Any, w: np.ndarray) -> CpuStaged:
        """Not here: the host's witness map is the ConstraintEvaluator's (``witness_on_device`` False)."""
        raise NotImplementedError("the CPU backend stages a, b, c (ConstraintEvaluator.evaluate), not a witness")

    def stage(self, key: CpuKey, inputs: ProverInputs) -> CpuStaged:
        """Copy the partition into private memory (after this the ring segment may be unlinked)."""
        z = key.zkey
        if inputs.a.shape != (z.domain_size, 4) or inputs.w.shape != (z.n_vars, 4):
            raise InputError(
                f"partition shape mismatch: a {inputs.a.shape}, w {inputs.w.shape}; "
                f"key expects ({z.domain_size}, 4) and ({z.n_vars}, 4)")
        a, b, c, w = (np.array(v, dtype=np.uint64, copy=True) for v in (inputs.a, inputs.b, inputs.c, inputs.w))
        return CpuStaged(a, b, c, w)

    def h_values(self, key: CpuKey, staged: CpuStaged) -> np.ndarray:
        """Standard-form H scalars (odd-coset values of A*B - C); a, b and c are dropped afterwards."""
        if staged.a is None or staged.b is None or staged.c is None:
            raise ValueError("partition was released, or its H values were taken already")
        h = ntt.coset_h(staged.a, staged.b, staged.c)
        staged.a = staged.b = staged.c = None
        return h

    def msm(self, key: CpuKey, section: str, scalars: np.ndarray) -> Future[Any]:
        """The MSM of a key section, queued on the pool as balanced pieces; a Future of the sum."""
        if section not in SECTIONS:
            raise InputError(f"unknown key section {section!r}: expected one of {', '.join(SECTIONS)}")
        points: Sequence[Any] = getattr(key, section)
        check_scalar_count(section, len(points), scalars.shape[0])
        identity = G2Point.identity() if section == "b2" else G1Point.identity()
        ones, rest = _split01(scalars)
        pieces = max(1, min(self.threads, rest.size // MIN_CHUNK))
        parts = [self._pool.submit(_sum_points, points, ones, identity)]
        parts += [self._pool.submit(_pippenger, points, scalars, chunk, identity)
                  for chunk in np.array_split(rest, pieces)]
        return _combined(parts)

    def msm_batch(self, key: CpuKey, section: str, scalars: Sequence[np.ndarray]) -> list[Future[Any]]:
        """k MSMs over one section: queued one after another on the pool (arkworks has no batched MSM)."""
        return msm_each(self, key, section, scalars)

    def release(self, staged: CpuStaged) -> dict[str, float]:
        """Drop the partition's copy (idempotent); no split of its own (the CPU prover's stages are
        the pipeline's)."""
        staged.a = staged.b = staged.c = staged.w = None
        return {}

    def stats(self) -> dict[str, float]:
        """``busy_seconds`` (kept at 0: the bench measures the CPU prover by its device stage)."""
        return {"busy_seconds": float(self.busy_seconds)}

    # ---- primitives
    def ntt(self, values: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Forward NTT, or the 1/n-scaled inverse."""
        return ntt.intt(values) if inverse else ntt.ntt(values)

    def coset_h(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Standard-form H scalars (odd-coset values of A*B - C)."""
        return ntt.coset_h(a, b, c)

    def msm_g1(self, points: np.ndarray, scalars: np.ndarray) -> G1Point:
        """G1 MSM over zkey-layout points."""
        return msm(curve.g1_lem_to_ark_list(points), scalars, G1Point.identity())

    def msm_g2(self, points: np.ndarray, scalars: np.ndarray) -> G2Point:
        """G2 MSM over zkey-layout points."""
        return msm(curve.g2_lem_to_ark_list(points), scalars, G2Point.identity())

    def fixed_base_g1(self, base: G1Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (numba windowed fixed-base)."""
        xy = curve.ark_to_g1(base)
        if xy is None:
            return np.zeros((scalars.shape[0], 12), dtype=np.uint64)
        return ec.fixed_base_g1(xy, scalars)

    def fixed_base_g2(self, base: G2Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (numba windowed fixed-base)."""
        xy = curve.ark_to_g2(base)
        if xy is None:
            return np.zeros((scalars.shape[0], 24), dtype=np.uint64)
        return ec.fixed_base_g2(xy, scalars)

    def close(self) -> None:
        """Stop the thread pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
