"""Generated, unrolled Montgomery arithmetic for numba, for any prime with 64-bit limbs.

One generator serves both fields (Fr with 4 limbs, Fq with 6): it emits
straight-line Python for ``mul``/``add``/``sub``/``neg`` on limb tuples, which
numba inlines into the vector kernels of :mod:`.fr_kernels` and :mod:`.fq_kernels`.
The multiply is CIOS with the "no-carry" shortcut (valid because each top limb
is < 2^63 - 1; Acar's thesis / gnark's "Faster Montgomery multiplication").
64x64 -> 128-bit products come from a tiny LLVM intrinsic.

Note on numba's on-disk cache: it is keyed on the file that defines each
kernel, so after editing this generator, delete ``__pycache__`` of the
algebra package (CI always starts fresh).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .field import MontParams
from .jit import njit


def _wide(builder: Any, args: Any) -> Any:
    i128 = ir.IntType(128)
    return [builder.zext(v, i128) for v in args]


def _split(context: Any, builder: Any, signature: Any, s: Any, hi_shift: int) -> Any:
    i64 = ir.IntType(64)
    lo = builder.trunc(s, i64)
    hi = builder.trunc(builder.lshr(s, ir.Constant(ir.IntType(128), hi_shift)), i64)
    return context.make_tuple(builder, signature.return_type, (lo, hi))


@intrinsic
def mac(typingctx: Any, a: Any, b: Any, c: Any, d: Any) -> Any:
    """(lo, hi) of a*b + c + d as uint64s; never overflows 128 bits."""
    if not all(t == types.uint64 for t in (a, b, c, d)):
        return None
    sig = types.UniTuple(types.uint64, 2)(a, b, c, d)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        x, y, z, w = _wide(builder, args)
        return _split(context, builder, signature, builder.add(builder.add(builder.mul(x, y), z), w), 64)

    return sig, codegen


@intrinsic
def adc(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """(sum, carry) of a + b + c."""
    if not all(t == types.uint64 for t in (a, b, c)):
        return None
    sig = types.UniTuple(types.uint64, 2)(a, b, c)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        x, y, z = _wide(builder, args)
        return _split(context, builder, signature, builder.add(builder.add(x, y), z), 64)

    return sig, codegen


@intrinsic
def sbb(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """(difference, borrow in {0,1}) of a - b - c."""
    if not all(t == types.uint64 for t in (a, b, c)):
        return None
    sig = types.UniTuple(types.uint64, 2)(a, b, c)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        x, y, z = _wide(builder, args)
        return _split(context, builder, signature, builder.sub(builder.sub(x, y), z), 127)

    return sig, codegen


def _final_sub(v: str, n: int) -> list[str]:
    """Return v - p if v >= p else v (v < 2p)."""
    lines = ["    br = U0"]
    lines += [f"    d{i}, br = sbb({v}{i}, P{i}, br)" for i in range(n)]
    lines.append("    if br == U0:")
    lines.append("        return " + ", ".join(f"d{i}" for i in range(n)))
    lines.append("    return " + ", ".join(f"{v}{i}" for i in range(n)))
    return lines


def _source(n: int) -> str:
    a = ", ".join(f"a{i}" for i in range(n))
    b = ", ".join(f"b{i}" for i in range(n))
    t = ", ".join(f"t{i}" for i in range(n))
    src = [f"def mul({a}, {b}):", "    z = U0"]
    for i in range(n):
        acc = [f"t{j}" for j in range(n)] if i else ["z"] * n
        src.append(f"    t0, A = mac(a0, b{i}, {acc[0]}, z)")
        src.append("    m = t0 * INV")
        src.append("    C = mac(m, P0, t0, z)[1]")
        for j in range(1, n):
            src.append(f"    t{j}, A = mac(a{j}, b{i}, {acc[j]}, A)")
            src.append(f"    t{j - 1}, C = mac(m, P{j}, t{j}, C)")
        src.append(f"    t{n - 1} = C + A")
    src += _final_sub("t", n)
    src += ["", f"def add({a}, {b}):", "    c = U0"]
    src += [f"    t{i}, c = adc(a{i}, b{i}, c)" for i in range(n)]
    src += _final_sub("t", n)
    src += ["", f"def sub({a}, {b}):", "    br = U0"]
    src += [f"    t{i}, br = sbb(a{i}, b{i}, br)" for i in range(n)]
    src += ["    if br != U0:", "        c = U0"]
    src += [f"        t{i}, c = adc(t{i}, P{i}, c)" for i in range(n)]
    src += [f"    return {t}", ""]
    src += [f"def redc({a}):"] + [f"    t{i} = a{i}" for i in range(n)] + ["    z = U0"]
    for _ in range(n):  # mul(a, 1): the products with the zero limbs of 1 drop out
        src.append("    m = t0 * INV")
        src.append("    C = mac(m, P0, t0, z)[1]")
        for j in range(1, n):
            src.append(f"    t{j - 1}, C = mac(m, P{j}, t{j}, C)")
        src.append(f"    t{n - 1} = C")
    src += _final_sub("t", n)
    src += ["", f"def is_zero({a}):", "    return (" + " | ".join(f"a{i}" for i in range(n)) + ") == U0", ""]
    src += [f"def lt_modulus({a}):", "    br = U0"]
    src += [f"    d{i}, br = sbb(a{i}, P{i}, br)" for i in range(n)]
    src += ["    return br != U0", ""]
    return "\n".join(src)


def generate(params: MontParams) -> SimpleNamespace:
    """Inline-able numba functions ``mul, add, sub, redc, is_zero, lt_modulus`` on limb tuples.

    ``redc(a)`` = a R^-1 (Montgomery form -> standard form), half the work of ``mul(a, 1)``.
    """
    n = params.nlimbs
    ns: dict[str, Any] = {"mac": mac, "adc": adc, "sbb": sbb, "U0": np.uint64(0), "INV": np.uint64(params.inv)}
    ns.update({f"P{i}": np.uint64(int(params.limbs[i])) for i in range(n)})
    exec(_source(n), ns)  # noqa: S102 - generated straight-line limb arithmetic
    names = ("mul", "add", "sub", "redc", "is_zero", "lt_modulus")
    return SimpleNamespace(**{k: njit(inline="always")(ns[k]) for k in names})
