"""Verification keys: derived from a zkey, prepared as arkworks objects for pairing checks; the
key's fixed points checked before either uses them.

``vk_from_zkey`` is what ``cuzk-mp zkey export verificationkey`` writes (the
snarkjs JSON, including ``vk_alphabeta_12`` = e(alpha1, beta2) as 12 Fq
coordinates). ``PreparedVk`` holds the same points as arkworks objects so a
pairing check costs ~2 ms; it is cached per zkey object.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from py_arkworks_bls12381 import GT, G1Point, G2Point

from ..algebra import curve
from ..algebra.field import FQ_BYTES, Q_MOD
from ..formats.snarkjs_json import VerificationKey
from ..formats.zkey import HEADER_POINTS, ZKey, section_error


def gt_coefficients(value: GT) -> list[list[list[str]]]:
    """An Fq12 element as snarkjs writes it: [c0, c1] of Fq6, each [c0, c1, c2] of Fq2 [a, b].

    arkworks prints a GT element as the hex of its canonical serialization: 12
    little-endian 48-byte Fq values in tower order (c0.c0.c0, c0.c0.c1, c0.c1.c0, ...).
    """
    raw = bytes.fromhex(str(value))
    if len(raw) != 12 * FQ_BYTES:
        raise ValueError(f"unexpected GT encoding of {len(raw)} bytes")
    vals = [int.from_bytes(raw[i * FQ_BYTES : (i + 1) * FQ_BYTES], "little") for i in range(12)]
    if any(v >= Q_MOD for v in vals):
        raise ValueError("unexpected GT encoding: coordinate >= q")
    s = [str(v) for v in vals]
    return [[[s[6 * h + 2 * k], s[6 * h + 2 * k + 1]] for k in range(3)] for h in range(2)]


_CHECKED: "weakref.WeakSet[ZKey]" = weakref.WeakSet()


def check_fixed_points(zkey: ZKey) -> None:
    """The key's header points (alpha, beta, gamma, delta) and IC points must each be a point of its
    group: on the curve and in the prime-order subgroup (the point at infinity passes). Otherwise
    a FormatError names the file, the section and the point. Once per zkey object: the verifying
    key and the proof's last step read these; the large sections are the backends' to convert."""
    if zkey in _CHECKED:
        return
    rows = [(name, name, getattr(zkey, name)) for name in HEADER_POINTS]
    rows += [("ic", f"point {i}", row) for i, row in enumerate(zkey.ic)]
    for field, label, row in rows:
        g1 = row.shape[-1] == 12
        try:
            if g1:
                curve.g1_to_ark(curve.g1_from_lem(row), checked=True)
            else:
                curve.g2_to_ark(curve.g2_from_lem(row), checked=True)
        except ValueError as exc:
            raise section_error(zkey, field, f"{label} is not a point of {'G1' if g1 else 'G2'}: {exc}") from None
    _CHECKED.add(zkey)


def vk_from_zkey(zkey: ZKey) -> VerificationKey:
    """The verification key of a zkey (snarkjs ``zkey export verificationkey``); its points checked."""
    check_fixed_points(zkey)
    alpha1 = curve.g1_from_lem(zkey.alpha1)
    beta2 = curve.g2_from_lem(zkey.beta2)
    alphabeta = GT.pairing(curve.g1_to_ark(alpha1), curve.g2_to_ark(beta2))
    return VerificationKey(
        n_public=zkey.n_public,
        alpha1=alpha1,
        beta2=beta2,
        gamma2=curve.g2_from_lem(zkey.gamma2),
        delta2=curve.g2_from_lem(zkey.delta2),
        ic=[curve.g1_from_lem(row) for row in zkey.ic],
        alphabeta_12=gt_coefficients(alphabeta),
    )


@dataclass
class PreparedVk:
    """A verification key as arkworks objects (checked on the curve and in the subgroup)."""

    n_public: int
    alpha1: G1Point
    beta2: G2Point
    gamma2: G2Point
    delta2: G2Point
    ic: list[G1Point]


def prepare_vk(vk: VerificationKey) -> PreparedVk:
    """Check and convert every point of ``vk`` (ValueError names the bad point)."""
    def g1(name: str, p: curve.G1Affine) -> G1Point:
        try:
            return curve.g1_to_ark(p, checked=True)
        except Exception as exc:
            raise ValueError(f"verification key: {name} is not a valid G1 point ({exc})") from exc

    def g2(name: str, p: curve.G2Affine) -> G2Point:
        try:
            return curve.g2_to_ark(p, checked=True)
        except Exception as exc:
            raise ValueError(f"verification key: {name} is not a valid G2 point ({exc})") from exc

    if len(vk.ic) != vk.n_public + 1:
        raise ValueError(f"verification key: IC has {len(vk.ic)} points, nPublic is {vk.n_public}")
    return PreparedVk(
        n_public=vk.n_public,
        alpha1=g1("vk_alpha_1", vk.alpha1),
        beta2=g2("vk_beta_2", vk.beta2),
        gamma2=g2("vk_gamma_2", vk.gamma2),
        delta2=g2("vk_delta_2", vk.delta2),
        ic=[g1(f"IC[{i}]", p) for i, p in enumerate(vk.ic)],
    )


_PREPARED: "weakref.WeakKeyDictionary[ZKey, PreparedVk]" = weakref.WeakKeyDictionary()


def prepared_vk_of(zkey: ZKey) -> PreparedVk:
    """The prepared verification key of a zkey, computed once per zkey object."""
    pvk = _PREPARED.get(zkey)
    if pvk is None:
        pvk = prepare_vk(vk_from_zkey(zkey))
        _PREPARED[zkey] = pvk
    return pvk
