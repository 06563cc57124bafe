"""Field arithmetic of the CUDA headers (kernels/ff) against Python ints.

Three layers of checks:
* the generated constant header matches a fresh run of scripts/gen_constants.py;
* the headers compiled as HOST C++ (their portable carry-chain fallback runs the
  very same even/odd CIOS code as the device) agree with Python ints on random
  and edge-case operands (needs a C++ compiler, no GPU);
* on a GPU (marker ``gpu``), kernels built through NVRTC agree with Python ints.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra.field import FQ, FR, Q_MOD, R_MOD, ints_to_limbs, limbs_to_ints

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels"
SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))

HOST_DRIVER = r"""
#include <cstdio>
#include <cstring>
#include "ff/fp2.cuh"
#include "ff/fr.cuh"
#include "ff/inv_binary.cuh"
template <class T> static T rd(int nl) {
    uint64_t w[12];
    for (int i = 0; i < nl; i++)
        if (scanf("%llx", (unsigned long long*)&w[i]) != 1) throw 1;
    return T::load(w);
}
template <class T> static void wr(const T& x, int nl) {
    uint64_t w[12];
    x.store(w);
    for (int i = 0; i < nl; i++) printf("%llx ", (unsigned long long)w[i]);
    printf("\n");
}
template <class T> static void run(const char* op, int nl) {
    T a = rd<T>(nl), b = rd<T>(nl);
    if (!strcmp(op, "mul")) wr(a * b, nl);
    else if (!strcmp(op, "madd")) {
        if constexpr (T::N == 12) wr(T::mul_add(a, b, a + b, a * b), nl);
    }
    else if (!strcmp(op, "add")) wr(a + b, nl);
    else if (!strcmp(op, "sub")) wr(a - b, nl);
    else if (!strcmp(op, "neg")) wr(a.neg(), nl);
    else if (!strcmp(op, "sqr")) wr(a.sqr(), nl);
    else if (!strcmp(op, "dbl")) wr(a.dbl(), nl);
    else if (!strcmp(op, "inv")) wr(a.inv(), nl);
    else if (!strcmp(op, "inb")) wr(inv_binary(a), nl);
    else if (!strcmp(op, "tom")) wr(a.to_mont(), nl);
    else if (!strcmp(op, "frm")) wr(a.from_mont(), nl);
    else if (!strcmp(op, "eq")) printf("%x\n", (int)(a == b));
}
int main() {
    char f[8], op[8];
    while (scanf("%7s %7s", f, op) == 2) {
        if (!strcmp(f, "q")) run<fp_t>(op, 6);
        else if (!strcmp(f, "r")) run<fr_t>(op, 4);
        else {
            fp2_t a = rd<fp2_t>(12), b = rd<fp2_t>(12);
            if (!strcmp(op, "mul")) wr(a * b, 12);
            else if (!strcmp(op, "sqr")) wr(a.sqr(), 12);
            else if (!strcmp(op, "inv")) wr(a.inv(), 12);
            else if (!strcmp(op, "nr")) wr(a.mul_by_nonresidue(), 12);
            else if (!strcmp(op, "mfp")) wr(a.mul_by_fp(b.c0), 12);
        }
    }
}
"""


def _edge(p: int, r_mod: int) -> list[int]:
    return [0, 1, 2, p - 1, p - 2, r_mod, p // 2, p // 2 + 1, (1 << 255) % p, p - r_mod]


def _half_edge(p: int, nl: int) -> list[int]:
    """Values with extreme halves (nl / 2 limbs each): equal halves, one half 0 or all ones, the low
    half just above or below the high one (long carry chains in the products)."""
    hb = 32 * nl  # bits in a half
    top = (p >> hb) - 1  # a high half that keeps the value below p
    lo_max = (1 << hb) - 1
    vals = [c * ((1 << hb) + 1) for c in (1, 2, top, top // 2)]
    vals += [top << hb, (top << hb) | lo_max, lo_max, 1 << hb, (1 << hb) - 1, (top << hb) | (top + 1),
             (top << hb) | (top - 1), (1 << hb) | lo_max, p - (1 << hb)]
    return list(dict.fromkeys(v % p for v in vals))


def _madd(a: int, b: int, p: int, ri: int) -> int:
    """The tests' mont_t::mul_add(a, b, a + b, a * b) on Montgomery-form values: (a b + c d) R^-1."""
    c, d = (a + b) % p, a * b * ri % p
    return (a * b + c * d) * ri % p


def _limbs(x: int, nl: int) -> str:
    return " ".join(f"{(x >> (64 * i)) & ((1 << 64) - 1):x}" for i in range(nl))


def _field_cases(rng: random.Random, tag: str, p: int, nl: int, count: int) -> list[tuple[str, int]]:
    r = 1 << (64 * nl)
    ri = pow(r, -1, p)
    vals = _edge(p, r % p)
    cases = []
    for i in range(count):
        a = vals[i % len(vals)] if i < 4 * len(vals) else rng.randrange(p)
        b = vals[(i // len(vals)) % len(vals)] if i < 4 * len(vals) else rng.randrange(p)
        expect = {
            "mul": a * b * ri % p, "add": (a + b) % p, "sub": (a - b) % p, "neg": -a % p,
            "sqr": a * a * ri % p, "dbl": 2 * a % p, "tom": a * r % p, "frm": a * ri % p,
        }
        if tag == "q":  # mont_t::mul_add is Fq's alone (it needs 3p < R)
            expect["madd"] = _madd(a, b, p, ri)
        if i < 40:
            expect["inv"] = pow(a * ri, -1, p) * r % p if a else 0
        if i < 200:  # the binary algorithm's paths depend on the value: more cases (it is cheap)
            expect["inb"] = pow(a * ri, -1, p) * r % p if a else 0
        for op, val in expect.items():
            cases.append((f"{tag} {op} {_limbs(a, nl)} {_limbs(b, nl)}", val))
        cases.append((f"{tag} eq {_limbs(a, nl)} {_limbs(a if i % 2 else b, nl)}", int(i % 2 == 1 or a == b)))
    half = _half_edge(p, nl) + vals
    for a in half:
        for b in half:
            cases.append((f"{tag} mul {_limbs(a, nl)} {_limbs(b, nl)}", a * b * ri % p))
        cases.append((f"{tag} sqr {_limbs(a, nl)} {_limbs(a, nl)}", a * a * ri % p))
    return cases


def _fp2_cases(rng: random.Random, count: int) -> list[tuple[str, int]]:
    p, r = Q_MOD, 1 << 384
    ri = pow(r, -1, p)
    cases = []
    for i in range(count):
        a0, a1, b0, b1 = (rng.randrange(p) for _ in range(4))
        if i == 0:
            a1 = 0
        m0 = (a0 * b0 - a1 * b1) * ri % p
        m1 = (a0 * b1 + a1 * b0) * ri % p
        s0, s1 = (a0 * a0 - a1 * a1) * ri % p, 2 * a0 * a1 * ri % p
        x0, x1 = a0 * ri % p, a1 * ri % p  # standard-form values of a
        norm_inv = pow(x0 * x0 + x1 * x1, -1, p)
        i0, i1 = x0 * norm_inv * r % p, -x1 * norm_inv * r % p
        args = f"{_limbs(a0 | a1 << 384, 12)} {_limbs(b0 | b1 << 384, 12)}"
        for op, (c0, c1) in {
            "mul": (m0, m1), "sqr": (s0, s1), "inv": (i0, i1),
            "nr": ((a0 - a1) % p, (a0 + a1) % p), "mfp": (a0 * b0 * ri % p, a1 * b0 * ri % p),
        }.items():
            cases.append((f"f2 {op} {args}", c0 | c1 << 384))
    return cases


@pytest.fixture(scope="module")
def host_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The field headers compiled as host C++ into a small stdin/stdout calculator."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler to build the field headers with")
    d = tmp_path_factory.mktemp("ffhost")
    (d / "drv.cpp").write_text(HOST_DRIVER)
    exe = d / "drv"
    subprocess.run([cxx, "-O1", "-std=c++17", "-w", f"-I{KERNELS}",
                    str(d / "drv.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def test_generated_constants_are_current() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_constants
    finally:
        sys.path.pop(0)
    assert gen_constants.HEADER_PATH.read_text() == gen_constants.render(), \
        "kernels/ff/bls12_381.cuh is stale: run python scripts/gen_constants.py"


def test_host_build_matches_python_ints(host_driver: Path) -> None:
    print(f"seed={SEED}")
    rng = random.Random(SEED)
    cases = _field_cases(rng, "q", Q_MOD, 6, 600) + _field_cases(rng, "r", R_MOD, 4, 600)
    cases += _fp2_cases(rng, 60)
    out = subprocess.run([str(host_driver)], input="\n".join(c for c, _ in cases),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert len(out) >= len(cases)
    bad = []
    for (cmd, want), line in zip(cases, out):
        got = sum(int(w, 16) << (64 * i) for i, w in enumerate(line.split()))
        if got != want:
            bad.append(f"{cmd[:60]}...: got {got:#x} want {want:#x}")
    assert not bad, f"seed={SEED}: {len(bad)} of {len(cases)} wrong, first: {bad[:3]}"


# ---------------------------------------------------------------- on the GPU (NVRTC build)

_OPS = {"mul": 0, "add": 1, "sub": 2, "neg": 3, "sqr": 4, "dbl": 5, "inv": 6, "tom": 7, "frm": 8, "eq": 9,
        "nr": 10, "mfp": 11, "inb": 12, "madd": 17}


def _expect(op: str, a: int, b: int, p: int, r: int) -> int:
    ri = pow(r, -1, p)
    return {
        "mul": a * b * ri, "add": a + b, "sub": a - b, "neg": -a, "sqr": a * a * ri, "dbl": 2 * a,
        "inv": pow(a * ri, -1, p) * r if a else 0, "inb": pow(a * ri, -1, p) * r if a else 0, "tom": a * r,
        "madd": _madd(a, b, p, ri),
        "frm": a * ri,
    }[op] % p


def _operands(rng: random.Random, p: int, r_mod: int, nl: int, n: int) -> tuple[list[int], list[int]]:
    edge = _edge(p, r_mod) + _half_edge(p, nl)
    a = [edge[i % len(edge)] if i < len(edge) ** 2 else rng.randrange(p) for i in range(n)]
    b = [edge[(i // len(edge)) % len(edge)] if i < len(edge) ** 2 else rng.randrange(p) for i in range(n)]
    return a, b


@pytest.fixture(scope="module")
def gpu_check() -> object:
    """The ff/check.cu test module (tests/gpu_emu/kernels; skips without CuPy or a device)."""
    cupy = pytest.importorskip("cupy")
    from cuzk_mp.backends import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device")
    from cuzk_mp.backends.gpu.modules import get_module
    from tests.gpu_emu import KERNELS

    return cupy, get_module("ff/check.cu", root=KERNELS)


@pytest.mark.gpu
@pytest.mark.parametrize("field", ["fq", "fr"])
def test_gpu_field_ops_match_python_ints(gpu_check: tuple, field: str) -> None:
    cupy, mod = gpu_check
    p, fp, nl = (Q_MOD, FQ, 6) if field == "fq" else (R_MOD, FR, 4)
    rng = random.Random(SEED + nl)
    n = 3000
    a, b = _operands(rng, p, fp.r_mod, nl, n)
    da, db = cupy.asarray(ints_to_limbs(a, nl)), cupy.asarray(ints_to_limbs(b, nl))
    out = cupy.empty_like(da)
    kern = mod.get_function(f"ff_check_{field}")
    for op in ("mul", "add", "sub", "neg", "sqr", "dbl", "inv", "inb", "tom", "frm", "eq") + (("madd",) if field == "fq" else ()):
        out.fill(0xDEADBEEF)  # poison: every row must be written
        m = 200 if op == "inv" else n
        kern(((m + 255) // 256,), (256,), (np.int32(_OPS[op]), da, db, out, np.uint64(m)))
        got = limbs_to_ints(cupy.asnumpy(out[:m]))
        want = [int(x == y) for x, y in zip(a, b)] if op == "eq" else [_expect(op, x, y, p, fp.r) for x, y in zip(a, b)]
        bad = [i for i in range(m) if got[i] != want[i]]
        assert not bad, f"seed={SEED} {field} {op}: {len(bad)} wrong, first row {bad[0]}: a={a[bad[0]]:#x} b={b[bad[0]]:#x}"


@pytest.mark.gpu
def test_gpu_fq2_ops_match_python_ints(gpu_check: tuple) -> None:
    cupy, mod = gpu_check
    rng = random.Random(SEED + 12)
    cases = _fp2_cases(rng, 300)
    by_op: dict[str, list[tuple[list[int], int]]] = {}
    for cmd, want in cases:
        parts = cmd.split()
        by_op.setdefault(parts[1], []).append(([int(w, 16) for w in parts[2:]], want))
    kern = mod.get_function("ff_check_fq2")
    for op, rows in by_op.items():
        words = np.array([w for w, _ in rows], dtype=np.uint64)
        da, db = cupy.asarray(words[:, :12].copy()), cupy.asarray(words[:, 12:].copy())
        out = cupy.full_like(da, 0xDEADBEEF)
        kern(((len(rows) + 255) // 256,), (256,), (np.int32(_OPS[op]), da, db, out, np.uint64(len(rows))))
        got = limbs_to_ints(cupy.asnumpy(out))
        bad = [i for i, (_, want) in enumerate(rows) if got[i] != want]
        assert not bad, f"seed={SEED} fq2 {op}: {len(bad)} of {len(rows)} wrong"
