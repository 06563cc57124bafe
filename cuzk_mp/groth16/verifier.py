"""The Groth16 verifier (snarkjs ``groth16_verify.js``), stricter than snarkjs.

Accept iff e(-pi_a, pi_b) e(cpub, gamma2) e(pi_c, delta2) e(alpha1, beta2) = 1,
with cpub = IC_0 + sum_i pub_i IC_(i+1), after checking that every public input
is < r and that the three proof points are on the curve *and in the prime-order
subgroup* (snarkjs checks only the curve).
"""

from __future__ import annotations

from py_arkworks_bls12381 import GT, G1Point, G2Point, Scalar

from ..algebra import curve
from ..algebra.field import R_MOD
from ..formats.snarkjs_json import Proof, VerificationKey
from .keys import PreparedVk, prepare_vk


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


def pairing_holds(pvk: PreparedVk, public: list[int], a: G1Point, b: G2Point, c: G1Point) -> bool:
    """The Groth16 pairing equation for already-validated points."""
    cpub = pvk.ic[0]
    if public:
        cpub = cpub + G1Point.multiexp_unchecked(pvk.ic[1:], [Scalar.from_le_bytes(v.to_bytes(32, "little")) for v in public])
    return bool(GT.pairing_check([-a, cpub, c, pvk.alpha1], [b, pvk.gamma2, pvk.delta2, pvk.beta2]))


def verify(vk: VerificationKey | PreparedVk, public: list[int], proof: Proof) -> bool:
    """True iff the proof verifies."""
    return check(vk, public, proof) is None
