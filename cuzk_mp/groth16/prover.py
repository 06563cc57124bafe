"""The Groth16 prover, step by step as snarkjs ``groth16_prove.js`` does it.

1. witness map: a = A w, b = B w, c = a o b           (:mod:`.synthesis`)
2. H: odd-coset values of A*B - C                       (backend: 3 iNTT, scale, 3 NTT)
3. MSMs over the key sections (backend), with these scalars:
     A  (section 5, G1)  w                the whole witness
     B1 (section 6, G1)  w
     B2 (section 7, G2)  w
     C  (section 8, G1)  w[n_public+1:]   the private wires only
     H  (section 9, G1)  the H values of step 2
4. with fresh r, s from the OS CSPRNG:
     pi_a = alpha1 + A + r delta1
     pi_b = beta2  + B2 + s delta2
     b1   = beta1  + B1 + s delta1
     pi_c = C + H + s pi_a + r b1 - r s delta1
          = C + H + s (alpha1 + A) + r (beta1 + B1) + r s delta1   (one 3-term multiexp)
5. self-verification: the proof's points are in G1, G2 and pass the pairing check before it
   is returned (what the verifier checks).

Steps 2-3 are ``prove_start`` (device work; ``prove_start_batch`` does k
partitions of one key in one pass); 4-5 are ``prove_finalize`` (host work), so
a GPU process can start the next partition while the last one finalizes;
``prove_finalize_batch`` assembles k proofs of one key and self-verifies them in
one pairing check (:func:`.verifier.batch_pairing_holds`). The
backend exposes primitives (:mod:`cuzk_mp.backends.base`): the recipe, which
scalars each MSM takes, is written here and nowhere else.
"""

from __future__ import annotations

import logging
import secrets
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ..algebra import curve
from ..algebra.field import R_MOD, limbs_to_ints
from ..backends.base import Backend, KeyHandle, MsmSums, ProverInputs, Staged
from ..errors import VerificationFailed
from ..formats.r1cs import R1CS
from ..formats.snarkjs_json import Proof
from ..formats.zkey import ZKey
from .keys import check_fixed_points, prepared_vk_of
from .synthesis import ConstraintEvaluator
from .verifier import PairingItem, batch_pairing_holds, pairing_holds, points_in_groups

log = logging.getLogger("cuzk_mp.groth16.prover")
T = TypeVar("T")


@dataclass
class HeaderPoints:
    """The zkey header's points as arkworks objects."""

    alpha1: G1Point
    beta1: G1Point
    beta2: G2Point
    delta1: G1Point
    delta2: G2Point


_HEADERS: "weakref.WeakKeyDictionary[ZKey, HeaderPoints]" = weakref.WeakKeyDictionary()


def header_points(zkey: ZKey) -> HeaderPoints:
    """alpha1, beta1, beta2, delta1, delta2 of a zkey (converted once per zkey object)."""
    hp = _HEADERS.get(zkey)
    if hp is None:
        check_fixed_points(zkey)
        hp = HeaderPoints(
            curve.g1_lem_to_ark(zkey.alpha1), curve.g1_lem_to_ark(zkey.beta1), curve.g2_lem_to_ark(zkey.beta2),
            curve.g1_lem_to_ark(zkey.delta1), curve.g2_lem_to_ark(zkey.delta2),
        )
        _HEADERS[zkey] = hp
    return hp


def public_signals(w: np.ndarray, n_public: int) -> list[int]:
    """w[1..n_public] as ints: outputs first, then public inputs (snarkjs public.json)."""
    return limbs_to_ints(w[1 : n_public + 1]) if n_public else []


def random_scalar() -> int:
    """A uniformly random non-zero element of Fr from the OS CSPRNG."""
    return 1 + secrets.randbelow(R_MOD - 1)


def prove_start(backend: Backend, key: KeyHandle, staged: Staged, n_public: int) -> MsmSums:
    """Steps 2-3: the H values and the five MSMs of a staged partition (device work).

    The order lets the CPU backend compute H on this thread while its pool runs the
    witness MSMs, and the GPU backend start G2 on its own stream first. Returns when
    every MSM is done (the caller holds the per-device lock around it).
    """
    return prove_start_batch(backend, key, [staged], n_public)[0]


def prove_start_batch(backend: Backend, key: KeyHandle, staged: Sequence[Staged], n_public: int) -> list[MsmSums]:
    """:func:`prove_start` for k staged partitions of one key in one pass: each section's k MSMs
    go to the backend together (:meth:`Backend.msm_batch`): G2 first, then A, B1, C and last the
    k H steps and the H MSMs, or, where the backend only enqueues (``h_early``), the H chain right
    after G2. Returns the k sums in order, when every MSM is done."""
    ws = [s.w for s in staged]
    pending = {"b2": backend.msm_batch(key, "b2", ws)}

    def h_chain() -> None:
        pending["h"] = backend.msm_batch(key, "h", [backend.h_values(key, s) for s in staged])

    if backend.h_early:
        h_chain()
    pending["a"] = backend.msm_batch(key, "a", ws)
    pending["b1"] = backend.msm_batch(key, "b1", ws)
    pending["c"] = backend.msm_batch(key, "c", [w[n_public + 1 :] for w in ws])
    if not backend.h_early:
        h_chain()
    return [MsmSums(**{name: futs[i].result() for name, futs in pending.items()}) for i in range(len(ws))]


def prove_finalize(zkey: ZKey, sums: MsmSums, public: list[int], *, verify: bool = True,
                   witness_checked: bool = False) -> Proof:
    """Steps 4-5: assemble the proof with fresh r, s; self-verify unless ``verify`` is False
    (:func:`prove_finalize_batch` of one item: VerificationFailed is raised)."""
    result = prove_finalize_batch(zkey, [(sums, public)], verify=verify, witness_checked=witness_checked)[0]
    if isinstance(result, VerificationFailed):
        raise result
    return result


def prove_finalize_batch(zkey: ZKey, items: Sequence[tuple[MsmSums, list[int]]], *, verify: bool = True,
                         witness_checked: bool | Sequence[bool] = False) -> list[Proof | VerificationFailed]:
    """Steps 4-5 for k proofs of one key: each assembled with its own fresh r, s, its points checked
    to lie in G1, G2 (:func:`.verifier.points_in_groups`), all self-verified in one pairing check
    (k + 3 pairs instead of 4 k). When that check fails, each proof is checked
    alone, so only the bad ones fail. Returns, in the order of ``items``, each proof or the
    VerificationFailed it fails with (returned, not raised: the caller fails those tasks alone).
    ``witness_checked``: the witnesses were found to satisfy the r1cs, so a failure is the key's,
    and the message says so; one flag for all, or one per item (a batch of one key may mix
    partitions whose witnesses were checked with others whose were not)."""
    checked = [witness_checked] * len(items) if isinstance(witness_checked, bool) else list(witness_checked)
    if len(checked) != len(items):
        raise ValueError(f"witness_checked has {len(checked)} flags for {len(items)} proofs")
    hp = header_points(zkey)
    points = [_assemble(hp, sums) for sums, _ in items]
    bad: set[int] = set()
    if verify and points:
        pvk = prepared_vk_of(zkey)
        bad = {i for i, p in enumerate(points) if not points_in_groups(*p)}
        good = [i for i in range(len(points)) if i not in bad]
        checks: list[PairingItem] = [(items[i][1], *points[i]) for i in good]
        if not batch_pairing_holds(pvk, checks):
            bad |= {good[0]} if len(checks) == 1 else {i for i, c in zip(good, checks) if not pairing_holds(pvk, *c)}
        if bad:
            log.warning("self-verification: %d of %d proofs failed", len(bad), len(points))
    return [_verification_failed(checked[i]) if i in bad else
            Proof(pi_a=curve.ark_to_g1(a), pi_b=curve.ark_to_g2(b), pi_c=curve.ark_to_g1(c))
            for i, (a, b, c) in enumerate(points)]


def _assemble(hp: HeaderPoints, sums: MsmSums) -> tuple[G1Point, G2Point, G1Point]:
    """Step 4 with fresh r, s: (pi_a, pi_b, pi_c)."""
    r, s = random_scalar(), random_scalar()
    fr = curve.fr_to_ark
    alpha_a = hp.alpha1 + sums.a
    pi_a = alpha_a + hp.delta1 * fr(r)
    pi_b = hp.beta2 + sums.b2 + hp.delta2 * fr(s)
    pi_c = sums.c + sums.h + G1Point.multiexp_unchecked([alpha_a, hp.beta1 + sums.b1, hp.delta1],
                                                        [fr(s), fr(r), fr(r * s)])
    return pi_a, pi_b, pi_c


def _verification_failed(witness_checked: bool) -> VerificationFailed:
    """The error of a proof failing its self-check, saying what is known of the cause: without
    the r1cs either the witness or the key may be at fault; with the witness found to satisfy
    the r1cs, only the key can be."""
    if witness_checked:
        return VerificationFailed(
            "the proof did not pass self-verification although the witness satisfies the r1cs: "
            "the proving key does not match this circuit or is damaged")
    return VerificationFailed(
        "the proof did not pass self-verification: the witness does not satisfy the circuit "
        "(give the .r1cs to find the failing constraint) or the key is corrupt")


def prove(
    backend: Backend,
    zkey: ZKey,
    w: np.ndarray,
    *,
    key: KeyHandle | None = None,
    evaluator: ConstraintEvaluator | None = None,
    r1cs: R1CS | None = None,
    verify: bool = True,
) -> tuple[Proof, list[int]]:
    """One whole proof: witness map, device work, assembly; returns (proof, public signals).

    Without ``key`` the key is loaded for this proof alone (``lasting=False``, with the circuit's
    rows where the device maps w) on a helper thread while the witness map, the key's header points
    and its prepared verification key are made on this one, and closed afterwards. Where the backend
    computes a, b, c where it keeps them (``witness_on_device``: the GPU) and no r1cs asks for the
    witness to be checked against C, only w is validated here and staged; a, b, c are made there.
    """
    t0 = time.perf_counter()
    marks: dict[str, float] = {}
    inputs: ProverInputs | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuzk-key-load") as pool:
        # the rows the device maps w with, where known now: the key uploads them beside its points
        rows = evaluator.data if evaluator is not None and _maps_on_device(backend, evaluator) else None
        loading = (pool.submit(_timed, backend.load_key, zkey, lasting=False, witness_rows=rows)
                   if key is None else None)
        try:
            evaluator = evaluator or ConstraintEvaluator.from_zkey(zkey, r1cs)
            if _maps_on_device(backend, evaluator):
                w = evaluator.validate_witness(w)
            else:
                inputs = evaluator.evaluate(w)
                w = inputs.w
            marks["witness_map"] = time.perf_counter() - t0
            if loading is not None:
                # The key's points that step 4 and the self-check use, converted once per key object
                # (~3-5 ms of arkworks work): made here, while the key still loads, not after the MSMs.
                header_points(zkey)
                if verify:
                    prepared_vk_of(zkey)
        except BaseException:
            if loading is not None:
                _close_quietly(loading)
            raise
        if loading is not None:
            key, marks["load_key"] = loading.result()
            marks["key_wait"] = time.perf_counter() - t0 - marks["witness_map"]
    assert key is not None
    try:
        t1 = time.perf_counter()
        staged = backend.stage(key, inputs) if inputs is not None else backend.stage_witness(key, evaluator.data, w)
        t2 = time.perf_counter()
        try:
            sums = prove_start(backend, key, staged, zkey.n_public)
        finally:
            backend.release(staged)
        t3 = time.perf_counter()
        public = public_signals(w, zkey.n_public)
        proof = prove_finalize(zkey, sums, public, verify=verify, witness_checked=evaluator.data.c is not None)
        marks.update(stage=t2 - t1, device=t3 - t2, finalize=time.perf_counter() - t3)
    finally:
        if loading is not None:
            key.close()
    log.info("%s%s", STEPS_LINE, ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in marks.items()))
    return proof, public


STEPS_LINE = "prove: "  # how the log line of a proof's steps begins: "prove: witness_map 1.9 ms, load_key 69.1 ms, ..."


def steps_of(line: str) -> dict[str, float]:
    """The steps of :func:`prove`'s log line (from :data:`STEPS_LINE` on) as {step: ms}."""
    text = line[line.index(STEPS_LINE) + len(STEPS_LINE):].strip()
    return {k: float(v) for k, v, _ in (part.split() for part in text.split(", "))}


def _maps_on_device(backend: Backend, evaluator: ConstraintEvaluator) -> bool:
    """Whether a, b, c are made by the backend from w (its witness map) rather than here: where it
    keeps them (the GPU) and no r1cs asks for the witness to be checked against C on the host."""
    return backend.witness_on_device and evaluator.data.c is None


def _timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def _close_quietly(loading: Future[tuple[KeyHandle, float]]) -> None:
    """Close a key whose load was started for a proof that failed before using it."""
    try:
        loading.result()[0].close()
    except Exception:  # noqa: BLE001 - the proof's own error is the one to report
        log.debug("closing the key of a failed proof", exc_info=True)
