"""The Groth16 verifier (snarkjs ``groth16_verify.js``), stricter than snarkjs.

Accept iff e(-pi_a, pi_b) e(cpub, gamma2) e(pi_c, delta2) e(alpha1, beta2) = 1,
with cpub = IC_0 + sum_i pub_i IC_(i+1), after checking that every public input
is < r and that the three proof points are on the curve *and in the prime-order
subgroup* (snarkjs checks only the curve).

:func:`batch_pairing_holds` checks k proofs of one key in one pairing check (k + 3
pairs, one final exponentiation): what the prover's self-verification of a batch uses.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from py_arkworks_bls12381 import GT, G1Point, G2Point

from ..algebra import curve
from ..algebra.field import R_MOD
from ..formats.snarkjs_json import Proof, VerificationKey
from .keys import PreparedVk, prepare_vk

BATCH_WEIGHT_BITS = 128  # a batch of proofs with a bad one passes with probability <= 2^-128
# (public signals, pi_a, pi_b, pi_c) of one proof, its points already validated
PairingItem = tuple[list[int], G1Point, G2Point, G1Point]


def check(vk: VerificationKey | PreparedVk, public: list[int], proof: Proof) -> str | None:
    """Why the proof does not verify, or None when it does."""
    try:
        pvk = vk if isinstance(vk, PreparedVk) else prepare_vk(vk)
    except ValueError as exc:
        return str(exc)
    if len(public) != pvk.n_public:
        return f"expected {pvk.n_public} public signals, got {len(public)}"
    for i, v in enumerate(public):
        if not 0 <= v < R_MOD:
            return f"public signal {i} is not a field element (must be < r)"
    try:
        a = curve.g1_to_ark(proof.pi_a, checked=True)
    except Exception:  # noqa: BLE001 - arkworks raises its own exception types
        return "pi_a is not a point of G1 (not on the curve or not in the subgroup)"
    try:
        b = curve.g2_to_ark(proof.pi_b, checked=True)
    except Exception:  # noqa: BLE001
        return "pi_b is not a point of G2 (not on the curve or not in the subgroup)"
    try:
        c = curve.g1_to_ark(proof.pi_c, checked=True)
    except Exception:  # noqa: BLE001
        return "pi_c is not a point of G1 (not on the curve or not in the subgroup)"
    return None if pairing_holds(pvk, public, a, b, c) else "pairing check failed: the proof does not match"


def points_in_groups(pi_a: G1Point, pi_b: G2Point, pi_c: G1Point) -> bool:
    """Whether a proof's points, already arkworks objects on their curves, lie in G1, G2 and G1.

    The prover's self-check of the proofs it makes: the key's large point sections are converted
    with the curve check alone (~0.1 ms a point for the subgroup), so a key whose points carry a
    small-order component gives sums that carry it too, and the pairing check cannot see it (a
    point of order 3 pairs to 1). Such a proof passes the pairing equation but not :func:`check`,
    and its torsion part is a residue of the witness that the key's maker can read.
    """
    return bool(pi_a.is_in_subgroup() and pi_b.is_in_subgroup() and pi_c.is_in_subgroup())


def pairing_holds(pvk: PreparedVk, public: list[int], a: G1Point, b: G2Point, c: G1Point) -> bool:
    """The Groth16 pairing equation for already-validated points."""
    cpub = pvk.ic[0]
    if public:
        cpub = cpub + G1Point.multiexp_unchecked(pvk.ic[1:], [curve.fr_to_ark(v) for v in public])
    return bool(GT.pairing_check([-a, cpub, c, pvk.alpha1], [b, pvk.gamma2, pvk.delta2, pvk.beta2]))


def batch_pairing_holds(pvk: PreparedVk, items: Sequence[PairingItem]) -> bool:
    """The Groth16 pairing equation of k proofs of one key at once, for already-validated points.

    Proof i holds iff X_i = e(-A_i, B_i) e(cpub_i, gamma2) e(C_i, delta2) e(alpha1, beta2) = 1.
    With independent secret weights rho_i drawn uniformly from [1, 2^128), bilinearity gives

        prod_i X_i^rho_i = prod_i e(-rho_i A_i, B_i) * e(sum_i rho_i cpub_i, gamma2)
                           * e(sum_i rho_i C_i, delta2) * e((sum_i rho_i) alpha1, beta2),

    one pairing check of k + 3 pairs (a multi-Miller loop and one final exponentiation), where
    sum_i rho_i cpub_i = (sum_i rho_i) IC_0 + sum_j (sum_i rho_i pub_ij) IC_(j+1) is one
    multi-exponentiation over IC. Every pairing of subgroup points lies in the order-r subgroup
    of GT. If every X_i = 1 the product is 1. If some X_j != 1, X_j has order r > 2^128, so with
    the other weights fixed, rho_j -> X_j^rho_j is injective on [1, 2^128): at most one value of
    rho_j makes the product 1, and the check passes with probability <= 2^-128. The weights must
    stay secret from whoever made the proofs (the OS CSPRNG, drawn per call).

    k = 1 is :func:`pairing_holds` itself (weight 1: no randomness is needed for one equation).
    A False names no culprit: check the proofs one by one to find the bad ones.
    """
    for public, *_ in items:
        if len(public) != pvk.n_public:
            raise ValueError(f"expected {pvk.n_public} public signals, got {len(public)}")
    if len(items) <= 1:
        return all(pairing_holds(pvk, *item) for item in items)
    rhos = [1 + secrets.randbelow(2**BATCH_WEIGHT_BITS - 1) for _ in items]
    ic_weights = [sum(rhos)] + [sum(rho * public[j] for rho, (public, *_) in zip(rhos, items))
                                for j in range(pvk.n_public)]
    cpub = G1Point.multiexp_unchecked(pvk.ic, [curve.fr_to_ark(x) for x in ic_weights])
    c_sum = G1Point.multiexp_unchecked([c for *_, c in items], [curve.fr_to_ark(rho) for rho in rhos])
    g1 = [-(a * curve.fr_to_ark(rho)) for rho, (_, a, _, _) in zip(rhos, items)]
    g2 = [b for _, _, b, _ in items]
    return bool(GT.pairing_check([*g1, cpub, c_sum, pvk.alpha1 * curve.fr_to_ark(sum(rhos))],
                                 [*g2, pvk.gamma2, pvk.delta2, pvk.beta2]))


def verify(vk: VerificationKey | PreparedVk, public: list[int], proof: Proof) -> bool:
    """True iff the proof verifies."""
    return check(vk, public, proof) is None
