"""GPU NTTs and the fused H step against the CPU implementation (cuzk_mp.algebra.ntt).

Fresh random Montgomery inputs every run (seed printed; CUZK_TEST_SEED replays
it), sizes 2^1 .. 2^20, both directions, the default kernel knobs and a small
tile (2^6, chunk 2^2) that forces several passes already at small sizes, plus
edge vectors (all 0, all r-1, a delta). Skipped without CuPy or a GPU.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.algebra import ntt as cpu_ntt
from cuzk_mp.algebra.field import R_MOD
from cuzk_mp.backends import gpu_available
from cuzk_mp.errors import InputError

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")
if not gpu_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from cuzk_mp.backends.gpu.ntt import GpuNtt, NttParams, pass_schedule  # noqa: E402

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))
R_TOP = R_MOD >> 192  # rows whose top limb is below r's are canonical


def random_fr(n: int, seed: int) -> np.ndarray:
    """n canonical Fr elements (any form), with 0, 1 and r-1 among the first rows."""
    g = np.random.default_rng(seed)
    a = g.integers(0, 1 << 63, size=(n, 4), dtype=np.uint64) * np.uint64(2) + g.integers(0, 2, size=(n, 4), dtype=np.uint64)
    a[:, 3] = g.integers(0, R_TOP, size=n, dtype=np.uint64)
    for i, v in enumerate((0, 1, R_MOD - 1)[: n]):
        a[i] = fr.from_ints([v], mont=False)[0]
    return a


@pytest.fixture(scope="module", params=["default", "small_tile"])
def engine(request: pytest.FixtureRequest) -> GpuNtt:
    """The NTT launcher with the shipped knobs, and with a tile small enough for many passes."""
    return GpuNtt() if request.param == "default" else GpuNtt(NttParams(tile_lg=6, chunk_lg=2, threads=64))


def _gpu_ntt(engine: GpuNtt, a: np.ndarray, inverse: bool) -> np.ndarray:
    d = cupy.asarray(a)
    engine.ntt_in_place(d, inverse=inverse)
    return cupy.asnumpy(d)


@pytest.mark.parametrize("lg", [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 16, 19, 20])
@pytest.mark.parametrize("inverse", [False, True])
def test_ntt_matches_cpu(engine: GpuNtt, lg: int, inverse: bool) -> None:
    if lg > 16 and engine.params.tile_lg < 10:
        pytest.skip("large sizes run with the shipped knobs only")
    seed = SEED + 97 * lg + int(inverse)
    a = random_fr(1 << lg, seed)
    want = cpu_ntt.intt(a) if inverse else cpu_ntt.ntt(a)
    got = _gpu_ntt(engine, a, inverse)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"seed={seed} lg={lg} passes={pass_schedule(lg, engine.params)}: rows {bad[:8]} differ"


@pytest.mark.parametrize("lg", [1, 4, 8, 10, 12, 15, 17, 19, 20])
def test_coset_h_matches_cpu(engine: GpuNtt, lg: int) -> None:
    if lg > 15 and engine.params.tile_lg < 10:
        pytest.skip("large sizes run with the shipped knobs only")
    seed = SEED + 31 * lg
    a, b, c = (random_fr(1 << lg, seed + i) for i in range(3))
    want = cpu_ntt.coset_h(a, b, c)
    da, db, dc = (cupy.asarray(x) for x in (a, b, c))
    got = cupy.asnumpy(engine.coset_h_in_place(da, db, dc))
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"seed={seed} lg={lg}: rows {bad[:8]} differ"


@pytest.mark.parametrize("kind", ["zeros", "minus_one", "delta"])
def test_edge_vectors(kind: str) -> None:
    n = 1 << 12
    if kind == "zeros":
        a = np.zeros((n, 4), dtype=np.uint64)
    elif kind == "minus_one":
        a = np.broadcast_to(fr.const(R_MOD - 1), (n, 4)).copy()
    else:
        a = np.zeros((n, 4), dtype=np.uint64)
        a[7] = fr.const(1)
    eng = GpuNtt()
    for inverse in (False, True):
        want = cpu_ntt.intt(a) if inverse else cpu_ntt.ntt(a)
        assert np.array_equal(_gpu_ntt(eng, a, inverse), want), f"{kind} inverse={inverse}"


def test_round_trip_2_22() -> None:
    a = random_fr(1 << 22, SEED)
    eng = GpuNtt()
    d = cupy.asarray(a)
    eng.ntt_in_place(d)
    assert not cupy.array_equal(d, cupy.asarray(a))
    eng.ntt_in_place(d, inverse=True)
    assert np.array_equal(cupy.asnumpy(d), a), f"seed={SEED}"


def test_rejects_bad_shapes() -> None:
    eng = GpuNtt()
    with pytest.raises(InputError):
        eng.ntt_in_place(cupy.zeros((12, 4), dtype=np.uint64))
    with pytest.raises(InputError):
        eng.ntt_in_place(cupy.zeros((16, 3), dtype=np.uint64))
    with pytest.raises(InputError):
        eng.coset_h_in_place(*(cupy.zeros((n, 4), dtype=np.uint64) for n in (16, 16, 8)))


def test_kernel_defaults_match_python() -> None:
    import re

    from cuzk_mp.backends.gpu.ntt import KERNEL_DEFAULTS
    from cuzk_mp.backends.gpu.source import read_kernel_file

    src = read_kernel_file("ntt/ntt.cu")
    found = {k: int(v) for k, v in re.findall(r"#define (NTT_\w+) (\d+)", src)}
    assert found == KERNEL_DEFAULTS
    p = NttParams()
    assert (p.tile_lg, p.chunk_lg, p.threads) == tuple(KERNEL_DEFAULTS.values())
    assert p.defines() == {}


def test_plan_params_lowers_chunk_only_to_save_a_pass() -> None:
    from cuzk_mp.backends.gpu.ntt import plan_params

    for lg in range(1, 29):
        chosen = plan_params(lg, NttParams())
        assert len(pass_schedule(lg, chosen)) <= len(pass_schedule(lg, NttParams()))
        assert chosen.chunk_lg == (1 if lg in (19, 27, 28) else 2), lg
    assert plan_params(27, NttParams(adapt_chunk=False)).chunk_lg == 2
