"""snarkjs JSON: proof.json, public.json and verification_key.json for BLS12-381 Groth16.

Shapes (snarkjs-formats.md section 7; snarkjs ``groth16_prove.js``,
``zkey_export_verificationkey.js``, ffjavascript ``fromObject``): every number
is a decimal string of the standard-form integer. Points are written affine
as projective triples with z = "1" (G2: z = ["1", "0"]), infinity as
["0", "1", "0"] (G2: [["0","0"], ["1","0"], ["0","0"]]). When reading, like
snarkjs: z = 1 is affine, z = 0 is infinity, any other z is Jacobian
(X/Z^2, Y/Z^3), and a 2-element [x, y] is affine.

In Python, points are "affine ints" (cuzk_mp.algebra.curve): G1 ``(x, y)``,
G2 ``((x0, x1), (y0, y1))``, None for infinity. This module checks syntax and
ranges only (< q for coordinates; public signals outside [0, r) are the verifier's
"invalid", as in snarkjs); on-curve and subgroup checks are the verifier's job. Numbers are decimal strings ``[0-9]+`` or
``0x`` hex strings (what snarkjs's ``unstringifyBigInts`` turns into BigInts); JSON
integers are accepted where a JavaScript double holds them exactly (snarkjs's JSON.parse
rounds the others, so it would check another value: :func:`read_json` refuses those,
advising the decimal string); anything else (signs,
floats, booleans, spaces) is a FormatError naming the field, e.g.
``proof.json: pi_b[1][0]: not a decimal or 0x hex string``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..algebra.curve import G1Affine, G2Affine
from ..algebra.field import Q_MOD, fq2_inv_int, fq2_mul_int
from ..errors import FormatError, InputError
from .atomic import read_at_most
from .atomic import write_json as write_json  # re-exported: where the readers are

PROTOCOL = "groth16"
CURVE = "bls12381"
MAX_DIGITS = 200  # a decimal value (coordinates are < q, 115 digits)
MAX_JSON_DEPTH = 16  # the deepest snarkjs file, a vk with vk_alphabeta_12, nests 4 deep
_DECIMAL = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_HEX = re.compile(rf"0x[0-9a-fA-F]{{1,{MAX_DIGITS}}}")  # as snarkjs's unstringifyBigInts reads it
Fq2 = tuple[int, int]


@dataclass
class Proof:
    """A Groth16 proof: pi_a, pi_c in G1 and pi_b in G2, as affine ints."""

    pi_a: G1Affine
    pi_b: G2Affine
    pi_c: G1Affine


@dataclass
class VerificationKey:
    """snarkjs's verification_key.json: IC has n_public + 1 points.

    ``alphabeta_12`` = e(alpha1, beta2) as nested lists [2][3][2] of Fq values
    (ints, or decimal strings when built by hand); informational only, None
    when absent (it is then not written).
    """

    n_public: int
    alpha1: G1Affine
    beta2: G2Affine
    gamma2: G2Affine
    delta2: G2Affine
    ic: list[G1Affine]
    alphabeta_12: list[Any] | None


# ---------------------------------------------------------------------- writing


def g1_to_json(p: G1Affine) -> list[str]:
    """A G1 point as snarkjs writes it: [x, y, "1"], infinity ["0", "1", "0"]."""
    if p is None:
        return ["0", "1", "0"]
    return [str(p[0]), str(p[1]), "1"]


def g2_to_json(p: G2Affine) -> list[list[str]]:
    """A G2 point as snarkjs writes it: [[x0, x1], [y0, y1], ["1", "0"]]."""
    if p is None:
        return [["0", "0"], ["1", "0"], ["0", "0"]]
    (x0, x1), (y0, y1) = p
    return [[str(x0), str(x1)], [str(y0), str(y1)], ["1", "0"]]


def proof_to_json(p: Proof) -> dict[str, Any]:
    """proof.json's object, keys in snarkjs's order."""
    return {"pi_a": g1_to_json(p.pi_a), "pi_b": g2_to_json(p.pi_b), "pi_c": g1_to_json(p.pi_c),
            "protocol": PROTOCOL, "curve": CURVE}


def public_to_json(values: list[int]) -> list[str]:
    """public.json: the public signals as decimal strings."""
    return [str(int(v)) for v in values]


def vk_to_json(vk: VerificationKey) -> dict[str, Any]:
    """verification_key.json's object, keys in snarkjs's order."""
    if len(vk.ic) != vk.n_public + 1:
        raise ValueError(f"verification key has {len(vk.ic)} IC points for nPublic {vk.n_public}")
    out: dict[str, Any] = {
        "protocol": PROTOCOL, "curve": CURVE, "nPublic": vk.n_public,
        "vk_alpha_1": g1_to_json(vk.alpha1), "vk_beta_2": g2_to_json(vk.beta2),
        "vk_gamma_2": g2_to_json(vk.gamma2), "vk_delta_2": g2_to_json(vk.delta2),
    }
    if vk.alphabeta_12 is not None:
        out["vk_alphabeta_12"] = [[[str(int(c)) for c in fq2] for fq2 in fq6] for fq6 in vk.alphabeta_12]
    out["IC"] = [g1_to_json(p) for p in vk.ic]
    return out


# ---------------------------------------------------------------------- reading


class _Ctx:
    """Where we are in a JSON document, for error messages."""

    def __init__(self, name: str) -> None:
        """Errors will name the document ``name``."""
        self.name = name

    def fail(self, where: str, problem: str) -> FormatError:
        """FormatError "<name>: <where>: <problem>"."""
        return FormatError(self.name, None, f"{where}: {problem}")

    def integer(self, value: Any, where: str) -> int:
        """A decimal string (a leading ``-`` allowed), a ``0x`` hex string or a JSON integer."""
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(where, f"not a decimal or 0x hex string ({type(value).__name__})")
        if isinstance(value, int):
            return value
        if _HEX.fullmatch(value):
            return int(value, 16)
        digits = value[1:] if value.startswith("-") else value
        if not _DECIMAL.fullmatch(digits):
            if len(digits) > MAX_DIGITS and digits.isdigit():
                raise self.fail(where, f"a decimal string of {len(digits)} digits, more than {MAX_DIGITS}")
            raise self.fail(where, f"not a decimal or 0x hex string: {value[:40]!r}")
        return int(value)

    def number(self, value: Any, where: str, bound: int, what: str) -> int:
        """:meth:`integer` in [0, bound)."""
        n = self.integer(value, where)
        if not 0 <= n < bound:
            raise self.fail(where, f"{n} is not < {what}" if n >= 0 else f"{n} is negative")
        return n

    def array(self, value: Any, where: str, lengths: tuple[int, ...]) -> list[Any]:
        """A JSON array with one of the given lengths."""
        if not isinstance(value, list):
            raise self.fail(where, f"expected an array, got {type(value).__name__}")
        if len(value) not in lengths:
            want = " or ".join(map(str, lengths))
            raise self.fail(where, f"expected {want} elements, got {len(value)}")
        return value

    def fq(self, value: Any, where: str) -> int:
        """An Fq element (< q)."""
        return self.number(value, where, Q_MOD, "q")

    def fq2(self, value: Any, where: str) -> Fq2:
        """An Fq2 element [c0, c1]."""
        arr = self.array(value, where, (2,))
        return self.fq(arr[0], f"{where}[0]"), self.fq(arr[1], f"{where}[1]")

    def g1(self, value: Any, where: str) -> G1Affine:
        """A G1 point [x, y] or [x, y, z] (z: 1 affine, 0 infinity, else Jacobian)."""
        arr = self.array(value, where, (2, 3))
        x, y = self.fq(arr[0], f"{where}[0]"), self.fq(arr[1], f"{where}[1]")
        z = self.fq(arr[2], f"{where}[2]") if len(arr) == 3 else 1
        if z == 0:
            return None
        if z == 1:
            return (x, y)
        zi = pow(z, -1, Q_MOD)
        zi2 = zi * zi % Q_MOD
        return (x * zi2 % Q_MOD, y * zi2 * zi % Q_MOD)

    def g2(self, value: Any, where: str) -> G2Affine:
        """A G2 point, as :meth:`g1` over Fq2."""
        arr = self.array(value, where, (2, 3))
        x, y = self.fq2(arr[0], f"{where}[0]"), self.fq2(arr[1], f"{where}[1]")
        z = self.fq2(arr[2], f"{where}[2]") if len(arr) == 3 else (1, 0)
        if z == (0, 0):
            return None
        if z == (1, 0):
            return (x, y)
        zi = fq2_inv_int(z)
        zi2 = fq2_mul_int(zi, zi)
        return (fq2_mul_int(x, zi2), fq2_mul_int(y, fq2_mul_int(zi2, zi)))

    def kind(self, value: Any, want: str) -> None:
        """FormatError where ``value`` is another of the snarkjs documents than ``want`` (a proof, public
        signals, a verification key): the file given in another's place is named for what it is."""
        if isinstance(value, list):
            kind = "public signals"
        elif isinstance(value, dict) and "pi_a" in value:
            kind = "a proof"
        elif isinstance(value, dict) and ("vk_alpha_1" in value or "IC" in value):
            kind = "a verification key"
        else:
            return
        if kind != want:
            raise FormatError(self.name, None, f"{kind}, not {want} (are the files in the right order?)")

    def obj(self, value: Any, keys: tuple[str, ...], want: str) -> dict[str, Any]:
        """A groth16/bls12381 JSON object holding every key of ``keys`` (the tags first: a PLONK or
        BN254 file is named as such, not by the first key it lacks; then another snarkjs document
        than ``want`` as what it is)."""
        self.kind(value, want)
        if not isinstance(value, dict):
            raise self.fail("top level", f"expected an object, got {type(value).__name__}")
        self.tag(value, "protocol", PROTOCOL)
        self.tag(value, "curve", CURVE)
        for key in keys:
            if key not in value:
                raise self.fail(key, "missing")
        return value

    def tag(self, obj: dict[str, Any], key: str, want: str) -> None:
        """If ``key`` is present it must equal ``want`` (e.g. curve "bls12381")."""
        if key in obj and obj[key] != want:
            raise self.fail(key, f"is {obj[key]!r}, expected {want!r}")


def proof_from_json(obj: Any, name: str = "proof.json") -> Proof:
    """Parse proof.json's object (points as snarkjs reads them; protocol/curve checked when present)."""
    ctx = _Ctx(name)
    d = ctx.obj(obj, ("pi_a", "pi_b", "pi_c"), "a proof")
    return Proof(pi_a=ctx.g1(d["pi_a"], "pi_a"), pi_b=ctx.g2(d["pi_b"], "pi_b"), pi_c=ctx.g1(d["pi_c"], "pi_c"))


def public_from_json(obj: Any, name: str = "public.json") -> list[int]:
    """Parse public.json: an array of integers (decimal strings). A value outside [0, r) is
    returned as it is, for the verifier to call the proof invalid (as snarkjs does: "Public
    inputs are not valid"), not refused as a malformed file: it is a well-formed claim that fails."""
    ctx = _Ctx(name)
    ctx.kind(obj, "public signals")
    if not isinstance(obj, list):
        raise ctx.fail("top level", f"expected an array, got {type(obj).__name__}")
    return [ctx.integer(v, f"[{i}]") for i, v in enumerate(obj)]


def vk_from_json(obj: Any, name: str = "verification_key.json") -> VerificationKey:
    """Parse verification_key.json (IC must hold nPublic + 1 points; vk_alphabeta_12 optional)."""
    ctx = _Ctx(name)
    keys = ("nPublic", "vk_alpha_1", "vk_beta_2", "vk_gamma_2", "vk_delta_2", "IC")
    d = ctx.obj(obj, keys, "a verification key")
    n_public = d["nPublic"]
    if isinstance(n_public, bool) or not isinstance(n_public, int) or n_public < 0:
        raise ctx.fail("nPublic", f"expected a non-negative integer, got {n_public!r}")
    ic = ctx.array(d["IC"], "IC", (n_public + 1,))
    alphabeta = None
    if "vk_alphabeta_12" in d:
        fq6s = ctx.array(d["vk_alphabeta_12"], "vk_alphabeta_12", (2,))
        alphabeta = [[list(ctx.fq2(fq2, f"vk_alphabeta_12[{h}][{k}]"))
                      for k, fq2 in enumerate(ctx.array(fq6, f"vk_alphabeta_12[{h}]", (3,)))]
                     for h, fq6 in enumerate(fq6s)]
    return VerificationKey(
        n_public=n_public,
        alpha1=ctx.g1(d["vk_alpha_1"], "vk_alpha_1"),
        beta2=ctx.g2(d["vk_beta_2"], "vk_beta_2"),
        gamma2=ctx.g2(d["vk_gamma_2"], "vk_gamma_2"),
        delta2=ctx.g2(d["vk_delta_2"], "vk_delta_2"),
        ic=[ctx.g1(p, f"IC[{i}]") for i, p in enumerate(ic)],
        alphabeta_12=alphabeta,
    )


# ---------------------------------------------------------------------- files


def read_json(path: str | os.PathLike[str]) -> Any:
    """Load a snarkjs JSON file; InputError if unreadable, FormatError naming the file if it is
    not JSON (with the line) or breaks the limits every snarkjs JSON file keeps: nesting at most
    ``MAX_JSON_DEPTH`` deep, number literals of at most ``MAX_DIGITS`` characters, no NaN."""
    # imported here: a one-shot ``groth16 prove`` writes JSON but reads none, and msgspec's import
    # (~10 ms, held under the GIL beside CuPy's) is then not on its start
    from . import json_bounds

    try:
        with open(path, "rb") as f:
            data = read_at_most(f, json_bounds.DEFAULT_MAX_BYTES)
    except OSError as exc:
        raise InputError(f"{os.fspath(path)}: cannot read: {exc.strerror or exc}") from exc
    return json_bounds.loads(data, os.fspath(path), max_depth=MAX_JSON_DEPTH, max_number_chars=MAX_DIGITS,
                             parse_number=json_bounds.js_number)
