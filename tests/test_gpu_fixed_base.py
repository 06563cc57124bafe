"""GPU batch fixed-base multiplication (cuzk_mp.backends.gpu.fixed_base) against arkworks.

Runs on the ``gpu`` kind (marker ``gpu``) and the ``emu`` kind (the CPU kernel
emulator of tests/gpu_emu; marker ``slow``). Fresh random scalars every run
(seed printed; CUZK_TEST_SEED replays it), with 0, 1, r - 1, r, 2^256 - 1 and
scalars with zero bytes among them; bases: the generator, a random point and
the identity; knobs that make chunks and per-thread batches not divide n.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_mp.algebra import curve
from cuzk_mp.algebra.field import R_MOD, ints_to_limbs
from cuzk_mp.errors import InputError
from tests.gpu_emu import module_for

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))
EDGE = [0, 1, 2, R_MOD - 1, R_MOD, R_MOD + 1, (1 << 256) - 1, 255, 256, 1 << 200, (1 << 64) + 1]


@pytest.fixture(scope="module")
def fb(kind: str) -> Any:
    """The fixed_base module for this kind."""
    print(f"seed {SEED}")
    return module_for(kind, "fixed_base")


def _ark(x: int) -> Scalar:
    return Scalar.from_le_bytes((x % R_MOD).to_bytes(32, "little"))


def _expected(base: Any, ints: list[int]) -> np.ndarray:
    to_lem = curve.g2_ark_to_lem if isinstance(base, G2Point) else curve.g1_ark_to_lem
    return np.stack([to_lem(base * _ark(v)) for v in ints])


def _bases(g2: bool) -> list[Any]:
    gen = G2Point() if g2 else G1Point()
    return [gen, gen * _ark(random.Random(SEED).randrange(1, R_MOD)), gen.identity()]


def _threads(kind: str, fb: Any) -> int:
    """Block width of the odd-geometry tests: 32 on the emulator (several blocks at n = 200), the
    shipped width on the GPU (``nthreads`` is compiled in: another width would compile the G2 module
    through NVRTC, ~2 min, for the same launch arithmetic the emulator covers)."""
    return 32 if kind == "emu" else fb.FixedBaseParams().nthreads


@pytest.mark.parametrize("g2", [False, True], ids=["g1", "g2"])
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_fixed_base_matches_arkworks(fb: Any, g2: bool, n: int) -> None:
    rng = random.Random(SEED + n)
    ints = (EDGE + [rng.randrange(R_MOD) for _ in range(n)])[:n] if n > 1 else [rng.randrange(R_MOD)]
    scalars = ints_to_limbs(ints, 4)
    for base in _bases(g2):
        want = _expected(base, ints)
        assert np.array_equal(fb.FixedBase(base).run(scalars), want), f"seed {SEED}"
    assert np.array_equal((fb.fixed_base_g2 if g2 else fb.fixed_base_g1)(_bases(g2)[0], scalars),
                          _expected(_bases(g2)[0], ints))


@pytest.mark.parametrize("g2", [False, True], ids=["g1", "g2"])
def test_odd_chunks(kind: str, fb: Any, g2: bool) -> None:
    """Chunks of 37 rows, 5 points per thread, blocks wider than a chunk: nothing divides n = 200."""
    rng = random.Random(SEED + 1)
    ints = EDGE + [rng.randrange(1 << 256) for _ in range(200 - len(EDGE))]
    base = _bases(g2)[1]
    params = fb.FixedBaseParams(nthreads=_threads(kind, fb), per_thread=5, chunk=37)
    got = fb.FixedBase(base, params).run(ints_to_limbs(ints, 4))
    assert np.array_equal(got, _expected(base, ints)), f"seed {SEED}"


@pytest.mark.parametrize("g2", [False, True], ids=["g1", "g2"])
@pytest.mark.parametrize("wbits", [4, 5, 7, 16])
def test_signed_windows_match_arkworks(kind: str, fb: Any, g2: bool, wbits: int) -> None:
    """The signed-window kernel (every batch takes it here: signed_min_rows 0) against arkworks: the
    edge scalars (0, r - 1, r, 2^256 - 1: a carry out of the last window), scalars whose windows are
    all at the borrow boundary (2^(wbits-1) and 2^(wbits-1) + 1 in every window) and random ones;
    5 and 7 bits cross the 64-bit words and leave a short last window, 16 is the default (GPU only:
    its table is 2^19 points)."""
    if wbits == 16 and kind != "gpu":
        pytest.skip("the 16-bit table is 2^19 points: the GPU only")
    rng = random.Random(SEED + wbits)
    nwin, half = -(-256 // wbits), 1 << (wbits - 1)
    boundary = [sum(h << (wbits * j) for j in range(nwin)) % (1 << 256) for h in (half, half + 1, 2 * half - 1)]
    ints = EDGE + boundary + [rng.randrange(1 << 256) for _ in range(20)] + [rng.randrange(R_MOD) for _ in range(20)]
    base = _bases(g2)[1]
    params = fb.FixedBaseParams(nthreads=_threads(kind, fb), per_thread=3, chunk=29, wbits=wbits, signed_min_rows=0)
    got = fb.FixedBase(base, params).run(ints_to_limbs(ints, 4))
    assert np.array_equal(got, _expected(base, ints)), f"seed {SEED}"


def test_signed_table_scalars(fb: Any) -> None:
    """Rows of the signed-window table's scalars: d 2^(wbits j) (reduced mod r where it could pass
    2^256), then the carry row 2^(wbits nwin) mod r."""
    from cuzk_mp.algebra.field import limbs_to_ints

    for wbits in (4, 5, 7, 16):
        nwin, half = -(-256 // wbits), 1 << (wbits - 1)
        rows = fb.signed_table_scalars(wbits)
        assert rows.shape == (nwin * half + 1, 4)
        got = limbs_to_ints(rows)
        for j, d in ((0, 1), (0, half), (1, 3), (nwin // 2, half - 1), (nwin - 1, 1), (nwin - 1, half)):
            assert got[j * half + d - 1] % R_MOD == (d << (wbits * j)) % R_MOD
            assert got[j * half + d - 1] < 1 << 256
        assert got[-1] == (1 << (wbits * nwin)) % R_MOD
    with pytest.raises(ValueError, match="wbits"):
        fb.signed_table_scalars(17)


def test_window_table(fb: Any) -> None:
    table = fb.window_table(G1Point())
    assert table.shape == (fb.NWIN * fb.ROWS, 12)
    for j, d in ((0, 1), (0, 255), (5, 17), (31, 255)):
        assert curve.g1_lem_to_ark(table[j * fb.ROWS + d - 1]) == G1Point() * _ark(d << (8 * j))


@pytest.mark.parametrize("g2", [False, True], ids=["g1", "g2"])
def test_multiples_table_matches_scalar_multiples(kind: str, fb: Any, g2: bool) -> None:
    """Rows [w n, (w + 1) n) of the MSM's table are 2^(c w) P_i: checked against fresh arkworks
    multiples, with infinity and a repeated point among the P_i, and knobs whose chunks and
    per-thread batches divide nothing (n = 45, chunk 17, 4 points per thread; 32-thread blocks on the
    emulator)."""
    rng = random.Random(SEED + 3)
    base = _bases(g2)[0]
    pts = [base * _ark(rng.randrange(1, R_MOD)) for _ in range(45)]
    pts[7] = base.identity()
    pts[9] = pts[8]
    to_lem = curve.g2_ark_to_lem if g2 else curve.g1_ark_to_lem
    host = np.stack([to_lem(p) for p in pts])
    c, windows = 5, 4
    params = fb.FixedBaseParams(nthreads=_threads(kind, fb), per_thread=4, chunk=17)
    table = fb.multiples_table(_device(kind, host), c, windows, params)
    got = np.asarray(_host(table))
    want = np.stack([to_lem(p * _ark(1 << (c * w))) for w in range(windows) for p in pts])
    assert np.array_equal(got, want), f"seed {SEED}"
    with pytest.raises(InputError, match="multiples"):
        fb.multiples_table(_device(kind, host[:, :5].copy()), c, windows)


def _device(kind: str, a: np.ndarray) -> Any:
    if kind == "emu":
        return a
    import cupy

    return cupy.asarray(a)


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else a


def test_bad_scalars(fb: Any) -> None:
    with pytest.raises(InputError, match=r"\(n, 4\) uint64"):
        fb.FixedBase(G1Point()).run(np.zeros((3, 5), dtype=np.uint64))


@pytest.mark.parametrize("g2", [False, True], ids=["g1", "g2"])
def test_large_sampled(kind: str, fb: Any, g2: bool) -> None:
    """2^16 random scalars on the GPU; 200 sampled rows (and the edge rows) against arkworks."""
    if kind != "gpu":
        pytest.skip("large sizes run on the GPU only")
    rng = random.Random(SEED + 2)
    n = 1 << 16
    ints = EDGE + [rng.randrange(R_MOD) for _ in range(n - len(EDGE))]
    base = _bases(g2)[1]
    got = fb.FixedBase(base).run(ints_to_limbs(ints, 4))
    rows = list(range(len(EDGE))) + rng.sample(range(n), 200)
    assert np.array_equal(got[rows], _expected(base, [ints[i] for i in rows])), f"seed {SEED}"
