"""GPU MSMs (cuzk_mp.backends.gpu.msm, G1 and G2) against arkworks.

Every test runs on two kinds: ``gpu`` (real CuPy + device, marker ``gpu``) and
``emu`` (tests/gpu_emu: the same host code and kernel bodies compiled as host
C++ and run thread by thread on the CPU; marker ``slow``). Fresh random inputs
every run (seed printed; CUZK_TEST_SEED replays it). The oracle is arkworks'
multiexp through the CPU backend's ``msm``, or, for the large GPU sizes, the
discrete-log identity sum_i s_i (t_i G) = (sum_i s_i t_i) G on bases made by
the fixed-base kernel from known t_i.

Edge cases: sizes 1, 7, 1000, 2^12 + 3 (and 2^16, 2^20 on the GPU), random and
PoRep-like (80 % 0/1) scalars, 0 / 1 / r - 1, all zero, only ones, infinity
among the bases, repeated points (P + P in one bucket), P next to -P, fewer
scalars than points, tiny knobs that force several window batches and
combine levels at small sizes, the G2 module's Fq2 products (calls, the
lazy-reduction product), precomputed multiples (one shared bucket set,
several window batches), scalar plans (classified once, cut for a suffix,
several MSMs enqueued before any result is collected), batched and graphed passes, the
counting and the radix sorts, and the batch-affine
accumulation (pairs of every kind inside one batch inversion, rounds and
segment sizes, with and without multiples), and the G2 accumulation by lane
pairs (one Fq2 component a lane: P + P, P + (-P), infinity, zero digits, the
ones' sum, with and without multiples).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
from typing import Any

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_mp.algebra import curve
from cuzk_mp.algebra.field import Q_MOD, R_MOD, ints_to_limbs, limbs_to_ints
from cuzk_mp.backends.cpu import msm as cpu_msm
from cuzk_mp.backends.gpu.msm_params import msm_params_for
from cuzk_mp.errors import ConfigError, InputError
from tests import gpu_emu
from tests.gpu_emu import KERNELS, module_for

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def msm(kind: str) -> Any:
    """The msm module for this kind."""
    print(f"seed {SEED}")
    return module_for(kind, "msm")


@pytest.fixture(scope="module")
def msm_plan(kind: str) -> Any:
    """The scalar-plan module (classify, dense plans, shared sorts) for this kind."""
    return module_for(kind, "msm_plan")


@pytest.fixture(autouse=True)
def xyzz_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Params made without an accumulation take XYZZ here (the path of keys up to 2^18 rows, of keys
    without B2 multiples and of plans without room for the grid lists): the grid tests set their
    rounds themselves, and test_default_accumulation_matches_arkworks takes the default."""
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "xyzz")


@pytest.fixture(params=[False, True], ids=["g1", "g2"])
def g2(request: pytest.FixtureRequest) -> bool:
    """Which group."""
    return bool(request.param)


def _ark(x: int) -> Scalar:
    return Scalar.from_le_bytes((x % R_MOD).to_bytes(32, "little"))


@functools.cache
def _points(n: int, g2: bool) -> np.ndarray:
    """n random points (random multiples of the generator), zkey layout."""
    rng = random.Random(SEED ^ (n << 1 | g2))
    gen = G2Point() if g2 else G1Point()
    to_lem = curve.g2_ark_to_lem if g2 else curve.g1_ark_to_lem
    base = [gen * _ark(rng.randrange(1, R_MOD)) for _ in range(min(n, 64))]
    pts, acc = [], base[0]
    for i in range(n):  # cheap distinct points: a running sum of random bases
        acc = acc + base[i % len(base)]
        pts.append(to_lem(acc))
    return np.stack(pts) if pts else np.zeros((0, 24 if g2 else 12), dtype=np.uint64)


def _scalars(n: int, kind: str, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    if kind == "random":
        vals = [rng.randrange(R_MOD) for _ in range(n)]
    elif kind == "porep":  # ~40 % zeros, ~40 % ones, ~20 % random field elements
        vals = [rng.choice((0, 0, 1, 1, rng.randrange(R_MOD))) for _ in range(n)]
    elif kind == "edge":
        special = [0, 1, R_MOD - 1, 2, R_MOD - 2, 1 << 254, 1 << 128, 3, (R_MOD - 1) // 2]
        vals = [special[i] if i < len(special) else rng.randrange(R_MOD) for i in range(n)]
    elif kind == "same":  # one value: every window's entries land in one bucket
        vals = [rng.randrange(R_MOD)] * n
    else:
        raise ValueError(kind)
    return ints_to_limbs(vals, 4)


def passes_of(msm: Any) -> dict[str, Any]:
    """The globals of the passes module this msm module's objects run (its sort reads them)."""
    return msm._MsmPasses._sort.__globals__  # type: ignore[no-any-return]


def _oracle(points: np.ndarray, scalars: np.ndarray, g2: bool) -> Any:
    pts = (curve.g2_lem_to_ark_list if g2 else curve.g1_lem_to_ark_list)(points[: scalars.shape[0]])
    return cpu_msm(pts, scalars, (G2Point if g2 else G1Point).identity())


def _run(msm: Any, points: np.ndarray, scalars: np.ndarray, g2: bool, params: Any = None) -> Any:
    obj = (msm.MsmG2 if g2 else msm.MsmG1)(points, params)
    try:
        return obj.run(scalars)
    finally:
        obj.close()


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
@pytest.mark.parametrize("dist", ["random", "porep"])
def test_msm_matches_arkworks(msm: Any, g2: bool, n: int, dist: str) -> None:
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + n)
    assert _run(msm, points, scalars, g2) == _oracle(points, scalars, g2), f"seed {SEED}"


def test_edge_scalars(msm: Any, g2: bool) -> None:
    points, scalars = _points(64, g2), _scalars(64, "edge", SEED)
    assert _run(msm, points, scalars, g2) == _oracle(points, scalars, g2), f"seed {SEED}"


@pytest.mark.parametrize("n", [1, 100])
def test_all_zero_and_all_one(msm: Any, g2: bool, n: int) -> None:
    points = _points(n, g2)
    identity = (G2Point if g2 else G1Point).identity()
    assert _run(msm, points, np.zeros((n, 4), dtype=np.uint64), g2) == identity
    ones = ints_to_limbs([1] * n, 4)
    assert _run(msm, points, ones, g2) == _oracle(points, ones, g2)
    minus = ints_to_limbs([R_MOD - 1] * n, 4)
    assert _run(msm, points, minus, g2) == _oracle(points, minus, g2)


def _special(g2: bool, dist: str) -> tuple[np.ndarray, np.ndarray]:
    """200 bases with infinity rows, a point repeated with one scalar (P + P in a bucket),
    and P next to -P with one scalar (they cancel inside buckets)."""
    n = 200
    points = _points(n, g2).copy()
    points[::7] = 0  # infinity among the bases
    points[1:40:3] = points[2]  # repeated point
    neg = (curve.g2_ark_to_lem if g2 else curve.g1_ark_to_lem)(
        -(curve.g2_lem_to_ark if g2 else curve.g1_lem_to_ark)(points[5]))
    points[6:60:4] = neg  # -P5 many times
    scalars = _scalars(n, dist, SEED + 7)
    scalars[1:40:3] = scalars[2]  # same scalar on the repeated point: identical digits
    scalars[6:60:4] = scalars[5]  # P5 and -P5 with one scalar cancel inside buckets
    return points, scalars


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_special_bases(msm: Any, g2: bool, dist: str) -> None:
    """Infinity rows, a point repeated with one scalar (P + P in a bucket), and P next to -P."""
    points, scalars = _special(g2, dist)
    assert _run(msm, points, scalars, g2) == _oracle(points, scalars, g2), f"seed {SEED}"


def test_the_fq_product_knobs_reach_the_modules_defines() -> None:
    """What the device-only module tests build (unfused and inlined Fq products): each knob's
    defines, checked on every machine; the modules themselves need the device."""
    from cuzk_mp.backends.gpu.msm_params import MsmParams

    default = MsmParams()
    assert default.defines(False)["EC_FQ_FUSED"] == 1 and "EC_FQ_FUSED" not in default.defines(True)
    assert "EC_FQ_FUSED" not in MsmParams(fq_fused=False).defines(False)
    assert default.defines(False)["EC_FQ_CALLS"] == 1
    assert "EC_FQ_CALLS" not in MsmParams(fq_calls=False).defines(False) and "EC_FQ_CALLS" not in default.defines(True)


def test_params_defines(msm: Any) -> None:
    """Compiled knobs per group: G1 keeps 4 blocks of 128 resident, fuses the formulas' Y3
    products and calls its Fq products, G2 compiles its Fq2 products as calls with the
    lazy-reduction product."""
    p = msm.MsmParams()
    assert p.defines(False) == {"MSM_G2": 0, "MSM_NTHREADS": 128, "MSM_ACC_MIN_BLOCKS": 4, "EC_FQ_FUSED": 1,
                                "EC_FQ_CALLS": 1}
    assert p.defines(True) == {"MSM_G2": 1, "MSM_NTHREADS": 128, "MSM_ACC_MIN_BLOCKS": 1, "EC_FP2_CALLS": 1,
                               "EC_FP2_LAZY": 1}
    q = msm.MsmParams(nthreads=64, acc_min_blocks=4)
    assert q.defines(False) == {"MSM_G2": 0, "MSM_NTHREADS": 64, "MSM_ACC_MIN_BLOCKS": 4, "EC_FQ_FUSED": 1,
                                "EC_FQ_CALLS": 1}
    assert msm.MsmParams(nthreads=512).defines(False)["MSM_ACC_MIN_BLOCKS"] == 1
    assert msm.MsmParams(nthreads=1024).defines(False)["MSM_ACC_MIN_BLOCKS"] == 1
    with pytest.raises(ConfigError, match="acc_min_blocks"):
        msm.MsmParams(acc_min_blocks=0)


@pytest.mark.parametrize("dist", ["random", "porep", "same", "edge"])
def test_tiny_knobs(msm: Any, g2: bool, dist: str) -> None:
    """Knobs that force window batches, combine levels and multi-level group sums at n = 300."""
    params = msm.MsmParams(seg=3, combine_seg=2, group=2, reduce_threads=4,
                           max_entries=700, window_bits=6)
    points, scalars = _points(300, g2), _scalars(300, dist, SEED + 11)
    assert _run(msm, points, scalars, g2, params) == _oracle(points, scalars, g2), f"seed {SEED}"


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_short_bucket_chunks(msm: Any, g2: bool, chunk: int, levels: int) -> None:
    """The small-MSM geometry: one, two or four buckets per reduction thread (the share's weight
    then ranges over every bucket index), groups of 4, with and without a fixed window; the chunks'
    weights given by a scalar multiplication in each thread (levels 1) or by a second reduction
    over the chunks' sums (levels 2, whose own chunks are then 1, 2 or 4 sums too; levels 0 takes it by size)."""
    points, scalars = _points(200, g2), _scalars(200, "random", SEED + 13)
    for bits in (None, 5):
        params = msm.MsmParams(seg=4, combine_seg=4, group=4, bucket_chunk_min=chunk, window_bits=bits,
                               reduce_levels=levels)
        assert _run(msm, points, scalars, g2, params) == _oracle(points, scalars, g2), f"seed {SEED}"
    with pytest.raises(ConfigError, match="bucket_chunk_min"):
        msm.MsmParams(bucket_chunk_min=3)
    with pytest.raises(ConfigError, match="reduce_levels"):
        msm.MsmParams(reduce_levels=3)


def test_second_reduction_by_size(msm: Any) -> None:
    """reduce_levels 0 takes the second reduction where the chunk threads fill the device (at least
    reduce_threads / 2 of them), the scalar multiplication a thread below; 1 and 2 are fixed."""
    auto = msm.MsmParams(reduce_levels=0, reduce_threads=1 << 15)
    assert not msm.MsmParams().second_reduction(1 << 20)  # the default: one level, as measured
    assert auto.second_reduction(1 << 14) and auto.second_reduction(1 << 15)
    assert not auto.second_reduction((1 << 14) - 1) and not auto.second_reduction(256)
    assert msm.MsmParams(reduce_levels=2).second_reduction(1)
    assert not msm.MsmParams(reduce_levels=1).second_reduction(1 << 20)


def test_fewer_scalars_than_points(msm: Any, g2: bool) -> None:
    points, scalars = _points(500, g2), _scalars(321, "porep", SEED + 3)
    obj = (msm.MsmG2 if g2 else msm.MsmG1)(points)
    assert obj.run(scalars) == _oracle(points, scalars, g2)
    assert obj.run(scalars[:0]) == (G2Point if g2 else G1Point).identity()
    assert set(obj.last_timings) >= {"ones", "d2h", "finish", "total"}
    assert obj.nbytes == points.nbytes
    obj.close()
    assert obj.nbytes == 0


def test_ones_segment(msm: Any) -> None:
    """Segments of the ones' sum fill whole waves of resident threads, none longer than seg."""
    f, r = msm.ones_segment, 33_792  # G2 at 2 blocks of 128 on 132 SMs
    assert f(6_700_000, r, 64) == 50  # 4 full waves instead of 3.1
    assert f(1_000_000, r, 64) == 30  # one wave with every resident thread busy
    assert f(100, r, 64) == 1
    assert f(6_700_000, None, 64) == 64  # no occupancy figure: params.seg
    for n1 in (1, 999, r * 64, r * 64 + 1, 10**7):
        seg = f(n1, r, 64)
        threads = -(-n1 // seg)
        waves = -(-threads // r)
        assert seg <= 64 and waves == max(1, -(-n1 // (r * 64))), n1


def test_fp2_lazy_mul(kind: str, msm: Any) -> None:  # msm: skips where this kind cannot run
    """fp2_lazy::mul (ff/fp2_lazy.cuh, the G2 MSM's Fq2 product) and fp2_t's product against
    Python ints on Montgomery-form Fq2 elements, with 0, 1, q - 1, q - 2, R mod q, ... among
    the coordinates (both signs of a0 b0 - a1 b1, the largest sums a0 + a1)."""
    rng = random.Random(SEED + 17)
    edge = [0, 1, Q_MOD - 1, Q_MOD - 2, (1 << 384) % Q_MOD, (Q_MOD - 1) // 2, 1 << 380]
    n = 500
    vals = [[rng.choice(edge) if rng.random() < 0.5 else rng.randrange(Q_MOD) for _ in range(4)] for _ in range(n)]
    a = ints_to_limbs([v for x in vals for v in x[:2]], 6).reshape(n, 12)
    b = ints_to_limbs([v for x in vals for v in x[2:]], 6).reshape(n, 12)
    out = _launch_check(kind, a, b, {})
    r_inv = pow(1 << 384, -1, Q_MOD)
    for i, (a0, a1, b0, b1) in enumerate(vals):
        want = [(a0 * b0 - a1 * b1) * r_inv % Q_MOD, (a0 * b1 + a1 * b0) * r_inv % Q_MOD]
        got = limbs_to_ints(out[i].reshape(4, 6))
        assert got[:2] == want and got[2:] == want, f"seed {SEED} row {i}: {vals[i]}"


def _launch_check(kind: str, a: np.ndarray, b: np.ndarray, defines: dict[str, int]) -> np.ndarray:
    """Run ec/check.cu's ec_fp2_mul_check on the device or in the emulator; (n, 24) out."""
    n = a.shape[0]
    if kind == "emu":
        kernel = gpu_emu.get_module("ec/check.cu", defines, root=KERNELS).get_function("ec_fp2_mul_check")
        out = np.zeros((n, 24), dtype=np.uint64)
        kernel((-(-n // 128),), (128,), (a, b, out, np.uint64(n)))
        return out
    import cupy

    from cuzk_mp.backends.gpu.modules import get_module

    kernel = get_module("ec/check.cu", defines, root=KERNELS).get_function("ec_fp2_mul_check")
    d_out = cupy.zeros((n, 24), dtype=np.uint64)
    kernel((-(-n // 128),), (128,), (cupy.asarray(a), cupy.asarray(b), d_out, np.uint64(n)))
    return cupy.asnumpy(d_out)


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_fq_unfused_module(kind: str, msm: Any, dist: str) -> None:
    """The G1 module whose formulas compute Y3 = a b - c d as two products (fq_fused=False; the
    default, EC_FQ_FUSED=1, is what every other test here runs) on the special bases (P + P, P - P,
    infinity) and on 1000 random ones. On the device only: the emulator checks the products themselves
    (test_gpu_field.py) and would spend ~50 s building the module."""
    if kind == "emu":
        pytest.skip("the unfused G1 module runs on the device; its products are emulator-tested")
    params = msm.MsmParams(fq_fused=False)
    points, scalars = _special(False, dist)
    assert _run(msm, points, scalars, False, params) == _oracle(points, scalars, False), f"seed {SEED}"
    points, scalars = _points(1000, False), _scalars(1000, dist, SEED + 11)
    assert _run(msm, points, scalars, False, params) == _oracle(points, scalars, False), f"seed {SEED}"


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_fq_inline_module(kind: str, msm: Any, dist: str) -> None:
    """The G1 module whose formulas inline their Fq products (fq_calls=False; the default,
    EC_FQ_CALLS=1, is what every other test here runs) on the special bases and on 1000 random
    ones. On the device only: on the emulator both modules are the same host code."""
    if kind == "emu":
        pytest.skip("the inlined G1 module differs from the default only in device code")
    params = msm.MsmParams(fq_calls=False)
    points, scalars = _special(False, dist)
    assert _run(msm, points, scalars, False, params) == _oracle(points, scalars, False), f"seed {SEED}"
    points, scalars = _points(1000, False), _scalars(1000, dist, SEED + 11)
    assert _run(msm, points, scalars, False, params) == _oracle(points, scalars, False), f"seed {SEED}"


# ------------------------------------------------------------------ precomputed multiples


def _to_device(kind: str, a: np.ndarray) -> Any:
    if kind == "emu":
        return a
    import cupy

    return cupy.asarray(a)


def _streams(kind: str, count: int) -> list[Any]:
    """``count`` non-blocking streams after the device is idle (uploads done), or [None] on the emulator."""
    if kind == "emu":
        return [None]
    import cupy

    cupy.cuda.Device().synchronize()
    return [cupy.cuda.Stream(non_blocking=True) for _ in range(count)]


# Multiples tables by (kind, group, c, points): several tests and parameter sets take the same
# points and window, and the MSM reads its table only, so each is built once by the fixed-base kernels
# (as a key's table is once per load) instead of once per MSM object.
_TABLES: dict[tuple[str, bool, int, bytes], Any] = {}


def _with_multiples(kind: str, msm: Any, points: np.ndarray, g2: bool, c: int, params: Any = None) -> Any:
    """An MSM object over ``points`` whose key-style multiples table (c-bit windows) is built
    by the fixed-base kernels, as GpuBackend.load_key does (once for these points and c: ``_TABLES``)."""
    w = msm.window_count(c)
    key = (kind, g2, c, points.tobytes())
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= 8:  # a few tables: the tests that share one come one after the other
            _TABLES.clear()
        table = _TABLES[key] = module_for(kind, "fixed_base").multiples_table(_to_device(kind, points), c, w)
    mul = msm.Multiples(table, c, w, points.shape[0])
    return (msm.MsmG2 if g2 else msm.MsmG1)(table[: points.shape[0]], params, mul)


@pytest.mark.parametrize("n", [1, 7, 400])
@pytest.mark.parametrize("dist", ["random", "porep", "edge"])
def test_multiples_match_arkworks(kind: str, msm: Any, g2: bool, n: int, dist: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every window adds 2^(c w) P_i into one shared bucket set; c = 7 (37 windows), and a
    max_entries that cuts them into window batches whose bucket sets are added (OP_ADD); the
    counting sort and the radix sort (keys holding the window below the bucket: wb > 0)."""
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + 31 + n)
    for bins in (1 << 20, 0):  # 0: every batch takes the radix sort
        monkeypatch.setitem(passes_of(msm), "COUNTING_SORT_BINS", bins)
        for params in (None, msm.MsmParams(max_entries=3 * n + 1, seg=5)):
            obj = _with_multiples(kind, msm, points, g2, 7, params)
            assert obj.run(scalars) == _oracle(points, scalars, g2), f"seed {SEED} {params} bins {bins}"
            assert obj.nbytes == points.nbytes * msm.window_count(7)


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_multiples_special_bases(kind: str, msm: Any, g2: bool, dist: str) -> None:
    """Infinity rows, P + P and P - P inside buckets, fewer scalars than points, with multiples."""
    points, scalars = _special(g2, dist)
    obj = _with_multiples(kind, msm, points, g2, 9, msm.MsmParams(seg=3, combine_seg=2, group=2))
    assert obj.run(scalars) == _oracle(points, scalars, g2), f"seed {SEED}"
    assert obj.run(scalars[:77]) == _oracle(points, scalars[:77], g2), f"seed {SEED}"


def test_choose_multiples_window(msm: Any) -> None:
    """The cost model's picks: fewer windows than without multiples, larger buckets sets."""
    assert [msm.choose_multiples_window(1 << lg) for lg in (16, 20, 24, 26)] == [16, 19, 22, 24]
    assert msm.window_count(22) == 12 and msm.window_count(msm.choose_window(1 << 24)) == 13
    assert all(8 <= msm.choose_multiples_window(n) <= 24 for n in (1, 2, 100, 10**9))


# ------------------------------------------------------------------ scalar plans


def test_plan_cut_and_enqueued_msms(kind: str, msm: Any, msm_plan: Any, g2: bool) -> None:
    """One classification of w serves w and its suffix w[k:] (the C MSM's scalars): the cut
    plan equals a fresh classification of the suffix, and four MSMs enqueued before any result
    is collected (plans, a dense plan, one with multiples) all match arkworks."""
    n, k = 600, 5
    points, scalars = _points(n, g2), _scalars(n, "porep", SEED + 41)
    scalars[3] = ints_to_limbs([1], 4)[0]
    d_s = _to_device(kind, scalars)
    plan = msm_plan.classify(d_s, cuts=(k,))
    assert k in plan.cuts
    cut, fresh = plan.tail(k), msm_plan.classify(_to_device(kind, scalars[k:].copy()))
    assert (cut.m, cut.n1, cut.n2) == (fresh.m, fresh.n1, fresh.n2) == (n - k, fresh.n1, fresh.n2)
    host = (lambda a: np.asarray(a)) if kind == "emu" else (lambda a: a.get())
    assert np.array_equal(host(cut.ones), host(fresh.ones)) and np.array_equal(host(cut.other), host(fresh.other))
    assert plan.tail(0) is plan and msm_plan.dense_plan(9).tail(4).n2 == 5
    cls = msm.MsmG2 if g2 else msm.MsmG1
    full, tail_obj = cls(points), cls(points[k:])
    dense = msm_plan.dense_plan(n)
    with_mul = _with_multiples(kind, msm, points, g2, 8)
    pending = [full.launch(d_s, plan), tail_obj.launch(d_s[k:], cut), full.launch(d_s, dense),
               with_mul.launch(d_s, plan)]
    want_full, want_tail = _oracle(points, scalars, g2), _oracle(points[k:], scalars[k:], g2)
    got = [p.result() for p in pending[::-1]][::-1]  # collected in reverse order
    assert got == [want_full, want_tail, want_full, want_full], f"seed {SEED}"
    assert {"ones", "digits", "sort", "accumulate", "reduce", "d2h", "finish", "total"} <= set(pending[0].timings)
    with pytest.raises(InputError, match="plan of 600 scalars for 595"):
        full.launch(d_s[k:], plan)


@pytest.mark.parametrize("mul", [None, 8], ids=["plain", "multiples"])
def test_shared_sorts(kind: str, msm: Any, msm_plan: Any, mul: int | None) -> None:
    """A partition's A, B1 (G1) and B2 (G2) MSMs over one plan sort its digits once: B2 makes
    the sorted keys on one stream, A and B1 take them on another, each result matches arkworks,
    and the entry is gone after its last user. With one section of another window size, that
    one sorts on its own and the other two still share; a pass in two window batches is not
    shared (every batch's keys would stay alive until the last user)."""
    n = 700
    scalars = _scalars(n, "porep", SEED + 43)
    d_s = _to_device(kind, scalars)
    pts = {"a": _points(n, False), "b1": _points(n, False)[::-1].copy(), "b2": _points(n, True)}
    n2 = int(np.count_nonzero([int.from_bytes(r.tobytes(), "little") > 1 for r in scalars]))

    def make(name: str, c: int | None, params: Any) -> Any:
        g2 = name == "b2"
        if c is not None:
            return _with_multiples(kind, msm, pts[name], g2, c, params)
        return (msm.MsmG2 if g2 else msm.MsmG1)(pts[name], params)
    w = msm.window_count(mul or msm.choose_window(n2))
    two_batches = msm.MsmParams(max_entries=n2 * -(-w // 2))  # windows in two batches: each MSM sorts its own
    for windows, params in (({"a": mul, "b1": mul, "b2": mul}, None), ({"a": mul, "b1": 9, "b2": mul}, None),
                            ({"a": mul, "b1": mul, "b2": mul}, two_batches)):
        objs = {name: make(name, c, params) for name, c in windows.items()}
        shared = windows["b1"] == mul and params is None
        sorted_by = []
        for name, obj in objs.items():
            real = obj._sort
            obj._sort = lambda *a, _real=real, _name=name: (sorted_by.append(_name), _real(*a))[1]
        plan = msm_plan.classify(d_s)
        plan.sorts = msm_plan.SharedSorts.for_msms([objs["a"], objs["b1"], objs["b2"]], plan.n2)
        assert sorted(plan.sorts.users.values()) == ([3] if shared else [] if params else [1, 2])
        if kind == "gpu":
            import cupy

            side, main = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        else:
            side = main = None
        pending = {"b2": objs["b2"].launch(d_s, plan, side)}
        pending["a"] = objs["a"].launch(d_s, plan, main)
        pending["b1"] = objs["b1"].launch(d_s, plan, main)
        for name, p in pending.items():
            assert p.result() == _oracle(pts[name], scalars, name == "b2"), f"seed {SEED} {name} {windows}"
        batches = -(-w // objs["a"].sort_signature(n2)[1])
        want = ["b2"] if shared else ["b2", "b1"] if params is None else ["b2", "a", "b1"]
        assert sorted_by == [name for name in want for _ in range(batches)], (sorted_by, batches)
        assert not plan.sorts._entries


def test_shared_sorts_of_a_boolean_plan(kind: str, msm: Any, msm_plan: Any) -> None:
    """A witness of zeros and ones alone (no tail scalars: a boolean circuit) shares no sort, and
    A, B1, B2 are each the sum of their points whose scalar is 1 (staging such a witness once
    divided by the tail count); with zeros alone each is the identity."""
    n = 300
    scalars = _scalars(n, "porep", SEED + 47)
    big = np.array([int.from_bytes(r.tobytes(), "little") > 1 for r in scalars])
    scalars[big] = 0
    scalars[big, 0] = 1
    pts = {"a": _points(n, False), "b1": _points(n, False)[::-1].copy(), "b2": _points(n, True)}
    objs = {name: (msm.MsmG2 if name == "b2" else msm.MsmG1)(p) for name, p in pts.items()}
    d_s = _to_device(kind, scalars)
    plan = msm_plan.classify(d_s)
    assert plan.n2 == 0 and 0 < plan.n1 < n
    plan.sorts = msm_plan.SharedSorts.for_msms(list(objs.values()), plan.n2)
    assert plan.sorts.users == {}
    for name, obj in objs.items():
        assert obj.launch(d_s, plan).result() == _oracle(pts[name], scalars, name == "b2"), f"seed {SEED} {name}"
    one_tail = scalars.copy()  # one tail scalar: one entry a window, shared by the three
    one_tail[7] = _scalars(1, "random", SEED + 48)[0]
    d_t = _to_device(kind, one_tail)
    plan = msm_plan.classify(d_t)
    plan.sorts = msm_plan.SharedSorts.for_msms(list(objs.values()), plan.n2)
    assert plan.n2 == 1 and list(plan.sorts.users.values()) == [3]
    for name, obj in objs.items():
        assert obj.launch(d_t, plan).result() == _oracle(pts[name], one_tail, name == "b2"), f"seed {SEED} {name}"
    assert not plan.sorts._entries
    zeros = _to_device(kind, np.zeros_like(scalars))  # nor a witness of zeros alone
    plan = msm_plan.classify(zeros)
    assert plan.n1 == plan.n2 == 0
    plan.sorts = msm_plan.SharedSorts.for_msms(list(objs.values()), plan.n2)
    for name, obj in objs.items():
        assert obj.launch(zeros, plan).result() == (G2Point if name == "b2" else G1Point).identity(), name


@pytest.mark.parametrize("mul", [None, 7], ids=["plain", "multiples"])
def test_batched_msms(kind: str, msm: Any, msm_plan: Any, g2: bool, mul: int | None) -> None:
    """k MSMs of one section as one pass (launch_batch, dense plans): each equals its own
    arkworks MSM, whatever the mix (random, PoRep-like, all zero, edge values), with window
    batches (small max_entries) and with a batch split because its keys would not fit 32 bits."""
    n, k = 120, 4
    points = _points(n, g2)
    vecs = [_scalars(n, d, SEED + 61 + j) for j, d in enumerate(("random", "porep", "edge", "random"))]
    vecs[3][:] = 0
    want = [_oracle(points, v, g2) for v in vecs]
    plans = [msm_plan.dense_plan(n)] * k
    cls = msm.MsmG2 if g2 else msm.MsmG1
    for params in (None, msm.MsmParams(max_entries=2 * k * n + 1, seg=3, combine_seg=2, group=2)):
        obj = _with_multiples(kind, msm, points, g2, mul, params) if mul else cls(points, params)
        got = [p.result() for p in obj.launch_batch([_to_device(kind, v) for v in vecs], plans)]
        assert got == want, f"seed {SEED} {params}"
        obj._batch_fit = lambda m: 3  # noqa: ARG005 - force a split into 3 + 1
        got = [p.result() for p in obj.launch_batch([_to_device(kind, v) for v in vecs], plans)]
        assert got == want, f"seed {SEED} {params} (split)"
    assert cls(points)._batch_fit(n) >= 64 and _with_multiples(kind, msm, points, g2, 7)._batch_fit(n) >= 64


@pytest.mark.parametrize("mul", [None, 7], ids=["plain", "multiples"])
def test_graphed_msms(kind: str, msm: Any, msm_plan: Any, g2: bool, mul: int | None,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense passes as captured CUDA graphs (params.graphs): lone and batched MSMs, many launched
    before any result is read (graphs reused while earlier runs are in flight, on two streams),
    each equal to arkworks; a pass above GRAPH_MAX_ENTRIES runs without a graph. The emulator cannot
    capture graphs (its passes without them are every other test's)."""
    if kind != "gpu":
        pytest.skip("CUDA graphs need a CUDA device")
    n, k = 300, 3
    points = _points(n, g2)
    vecs = [_scalars(n, d, SEED + 81 + j) for j, d in enumerate(("random", "porep", "edge", "same", "random"))]
    want = [_oracle(points, v, g2) for v in vecs]
    params = msm.MsmParams(seg=4, combine_seg=4, group=4, bucket_chunk_min=2, graphs=True)
    cls = msm.MsmG2 if g2 else msm.MsmG1
    obj = _with_multiples(kind, msm, points, g2, mul, params) if mul else cls(points, params)
    d = [_to_device(kind, v) for v in vecs]
    streams = _streams(kind, 2)
    pending = []
    for rep in range(3):
        for i, v in enumerate(d):
            pending.append((i, obj.launch(v, msm_plan.dense_plan(n), streams[(rep + i) % len(streams)])))
        batch = obj.launch_batch(d[:k], [msm_plan.dense_plan(n)] * k, streams[rep % len(streams)])
        pending += list(enumerate(batch))
    for i, p in pending[::-1]:
        assert p.result() == want[i], f"seed {SEED} vector {i}"
    graphs = obj._graphs
    assert msm.graphs_supported() and set(graphs) == {1, k}
    assert sum(len(runs) for runs in graphs.values()) <= msm.GRAPH_RUNS and "graph" in pending[0][1].timings
    from cuzk_mp.backends.gpu import msm_params

    monkeypatch.setattr(msm_params, "GRAPH_MAX_ENTRIES", n)  # any pass is larger now
    fresh = cls(points, params) if mul is None else obj
    fresh._graphs = {}
    assert fresh.launch(d[0], msm_plan.dense_plan(n)).result() == want[0] and fresh._graphs == {}
    obj.close()
    assert obj._graphs == {}


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_counting_and_radix_sorts_agree(msm: Any, g2: bool, dist: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting sort (window batches of few buckets) and the radix sort (any other) give the
    same sums: the accumulation needs only each bucket's entries together, zero digits last."""
    n = 200
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + 91)
    want = _oracle(points, scalars, g2)
    # the shipped limits, then every batch to the radix sort by its buckets, then by its keys
    for bins, keys, scan in ((1 << 20, 1 << 21, 1 << 16), (0, 1 << 21, 0), (1 << 20, 0, 0)):
        monkeypatch.setitem(passes_of(msm), "COUNTING_SORT_BINS", bins)
        monkeypatch.setitem(passes_of(msm), "COUNTING_SORT_KEYS", keys)
        monkeypatch.setitem(passes_of(msm), "COUNTING_SORT_SCAN_BINS", scan)
        for params in (None, msm.MsmParams(max_entries=3 * n, seg=3, combine_seg=2, group=2)):
            assert _run(msm, points, scalars, g2, params) == want, f"seed {SEED} bins {bins} keys {keys} {params}"


def test_the_counting_sort_takes_few_keys_or_very_few_buckets(msm: Any) -> None:
    """Which sort a window batch gets: the counting sort for every batch a CUDA graph may capture
    (as before the key-count rule) and for tiny bucket sets; the radix sort for a large batch over
    many buckets (whose one-block scan would take ~1 ms) and for any over COUNTING_SORT_BINS buckets."""
    g = passes_of(msm)
    takes, keys, bins, scan = (g["counting_sort_takes"], g["COUNTING_SORT_KEYS"], g["COUNTING_SORT_BINS"],
                               g["COUNTING_SORT_SCAN_BINS"])
    assert keys >= g["GRAPH_MAX_ENTRIES"] and scan < bins
    assert takes(keys, bins) and takes(1, 1) and takes(keys + 1, scan) and takes(1 << 30, 2)
    assert not takes(keys + 1, bins) and not takes(keys + 1, scan + 1) and not takes(1, bins + 1)


@pytest.mark.parametrize("n, bits", [(1, 9), (300, 9), (5000, 25), (9000, 18), (4096, 32)])
def test_radix_sort_is_a_stable_sort_on_the_low_bits(kind: str, msm: Any, n: int, bits: int) -> None:
    """The window batches' radix sort (sort.cuh) against numpy's stable argsort of the keys' low
    ``bits`` bits: one pass (9 bits) and several (18, 25, 32 bits: equal widths of at most 9),
    one tile and several (4096 keys a tile), a partial last tile, zero digits (MSM_KEY_NONE:
    every low bit set) and repeated keys, so stability is checked where it decides the order."""
    rng = np.random.default_rng(SEED + n + bits)
    top = min(1 << bits, 1 << 32) - 1
    keys = rng.integers(0, max(2, top // 64) if bits > 12 else top, size=n + 1, dtype=np.uint64).astype(np.uint32)
    keys[rng.random(n + 1) < 0.3] = 0xFFFFFFFF
    keys[rng.random(n + 1) < 0.1] = keys[0]
    want = np.argsort(keys[:n] & np.uint32(top), kind="stable")
    obj = msm.MsmG1(_points(8, False))
    got = obj._radix_sort(_to_device(kind, keys), n, bits)
    got = np.asarray(got.get() if hasattr(got, "get") else got)
    assert got.dtype == np.int64 and np.array_equal(got, want), f"seed {SEED}"


def test_radix_min_blocks_knob(msm: Any) -> None:
    """radix_min_blocks: msm_radix_scatter's register cap as a define of both groups' modules only when
    set (the kernel's default otherwise), refused outside [1, 8]."""
    assert "MSM_RADIX_MIN_BLOCKS" not in msm.MsmParams().defines(False)
    p = msm.MsmParams(radix_min_blocks=3)
    assert p.defines(False)["MSM_RADIX_MIN_BLOCKS"] == 3 and p.defines(True)["MSM_RADIX_MIN_BLOCKS"] == 3
    for bad in (0, 9):
        with pytest.raises(ConfigError, match="radix_min_blocks"):
            msm.MsmParams(radix_min_blocks=bad)


def test_batched_msms_refuse_mixed_plans(kind: str, msm: Any, msm_plan: Any) -> None:
    """A batch needs dense plans of one length: an index-list plan or a length mismatch is refused."""
    n = 40
    points, scalars = _points(n, False), _scalars(n, "porep", SEED + 71)
    obj = msm.MsmG1(points)
    d_s = _to_device(kind, scalars)
    with pytest.raises(InputError, match="dense plans of one length"):
        obj.launch_batch([d_s, d_s], [msm_plan.classify(d_s), msm_plan.dense_plan(n)])
    with pytest.raises(InputError, match="dense plans of one length"):
        obj.launch_batch([d_s, d_s[:20]], [msm_plan.dense_plan(n), msm_plan.dense_plan(20)])
    with pytest.raises(InputError, match="2 scalar vectors for 1 plans"):
        obj.launch_batch([d_s, d_s], [msm_plan.dense_plan(n)])


def test_bad_inputs(msm: Any) -> None:
    points = _points(8, False)
    obj = msm.MsmG1(points)
    bad = _scalars(8, "random", SEED)
    bad[3, 3] |= np.uint64(1 << 63)
    with pytest.raises(InputError, match="bit 255"):
        obj.run(bad)
    with pytest.raises(InputError, match="9 scalars for 8 points"):
        obj.run(_scalars(9, "random", SEED))
    with pytest.raises(InputError, match=r"\(n, 4\) uint64"):
        obj.run(np.zeros((8, 3), dtype=np.uint64))
    with pytest.raises(InputError, match=r"\(n, 24\) uint64"):
        msm.MsmG2(points)
    with pytest.raises(InputError, match="8 points, 7 scalars"):
        msm.msm_g1(points, bad[:7])
    with pytest.raises(ConfigError, match="group"):
        msm.MsmParams(group=3)


def test_one_shot_helpers(msm: Any) -> None:
    for g2 in (False, True):
        points, scalars = _points(50, g2), _scalars(50, "edge", SEED + 5)
        fn = msm.msm_g2 if g2 else msm.msm_g1
        assert fn(points, scalars) == _oracle(points, scalars, g2)


@pytest.mark.parametrize("acc", ["xyzz", "grid", "reduce2"])
@pytest.mark.parametrize("lg", [16, 20])
@pytest.mark.parametrize("dist", ["random", "porep"])
def test_large_against_discrete_logs(kind: str, msm: Any, g2: bool, lg: int, dist: str, acc: str) -> None:
    """Bases t_i G from the fixed-base kernel; sum_i s_i t_i G must equal (sum_i s_i t_i) G, with
    each accumulation (XYZZ; grid batch-affine with its default chunk and thread counts) and, over
    XYZZ, the bucket reduction's second level ("reduce2": the chunks' weights by a second reduction)."""
    if kind != "gpu":
        pytest.skip("large sizes run on the GPU only")
    import cupy

    fixed_base = module_for(kind, "fixed_base")
    n = 1 << lg
    g = np.random.default_rng(SEED + lg)
    t = g.integers(0, 1 << 63, size=(n, 4), dtype=np.uint64)
    t[:, 3] >>= np.uint64(2)  # < 2^254 < r
    s = _scalars(n, dist, SEED + lg) if lg <= 16 else _fast_scalars(g, n, dist)
    gen = G2Point() if g2 else G1Point()
    d_points = fixed_base.FixedBase(gen).run_device(cupy.asarray(t))
    params = (msm.MsmParams(ga_rounds=0, reduce_levels=2) if acc == "reduce2"
              else msm.MsmParams(ga_rounds=msm.grid_rounds(acc), ga_g1=True))
    got = (msm.MsmG2 if g2 else msm.MsmG1)(d_points, params).run(cupy.asarray(s), stream=cupy.cuda.Stream())
    tv = [int.from_bytes(r.tobytes(), "little") for r in t]
    sv = [int.from_bytes(r.tobytes(), "little") for r in s]
    assert got == gen * _ark(sum(a * b for a, b in zip(sv, tv))), f"seed {SEED}"


def _fast_scalars(g: np.random.Generator, n: int, dist: str) -> np.ndarray:
    """Random canonical scalars (top limb below r's); for "porep", 80 % replaced by 0 or 1."""
    s = g.integers(0, 1 << 63, size=(n, 4), dtype=np.uint64)
    s[:, 3] >>= np.uint64(2)
    if dist == "porep":
        pick = g.random(n)
        s[pick < 0.8] = 0
        s[pick < 0.4, 0] = 1
    return s


# ------------------------------------------------------------------ pairs of every kind


def _pair_kinds(g2: bool, n: int = 240) -> np.ndarray:
    """n bases where every kind of pair occurs at every position: in each 8, (P, P), (P, -P),
    (inf, P), (P, inf), then two ordinary pairs."""
    points = _points(n, g2).copy()
    to_ark = curve.g2_lem_to_ark if g2 else curve.g1_lem_to_ark
    to_lem = curve.g2_ark_to_lem if g2 else curve.g1_ark_to_lem
    for i in range(0, n, 8):
        points[i + 1] = points[i]
        points[i + 3] = to_lem(-to_ark(points[i + 2]))
        points[i + 4] = 0
        points[i + 7] = 0
    return points


@pytest.mark.parametrize("value", [1, 3])
def test_repeated_and_opposite_points(msm: Any, g2: bool, value: int) -> None:
    """Runs where P + P, P + (-P), inf + P and P + inf follow each other in the XYZZ accumulation:
    every scalar 1 (the ones' sum, one bucket) or 3 (one digit in one window: one bucket), over bases
    built so that each kind occurs at every position of a segment."""
    points = _pair_kinds(g2)
    scalars = ints_to_limbs([value] * len(points), 4)
    want = _oracle(points, scalars, g2)
    for seg in (2, 5, 8, 240):
        params = msm.MsmParams(seg=seg, window_bits=6, ga_rounds=0)
        assert _run(msm, points, scalars, g2, params) == want, f"seed {SEED} seg {seg}"


def test_accumulate_mode_from_env(msm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUZK_GPU_MSM_ACCUMULATE picks the default accumulation; a bad value is a ConfigError."""
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid")
    assert msm.MsmParams().ga_rounds > 0
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "xyzz")
    assert msm.MsmParams().ga_rounds == 0
    for bad in ("fast", "affine"):  # neither is a mode (auto, xyzz, grid, grid-g2): refused by name
        monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", bad)
        with pytest.raises(ConfigError, match=f"CUZK_GPU_MSM_ACCUMULATE='{bad}'"):
            msm.MsmParams()
    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")
    unset = msm.MsmParams()  # unset: "auto" (grid rounds for G2 where the plan fits their lists, XYZZ for G1)
    assert unset.grid(True) and not unset.grid(False) and unset.ga_where_fits
    assert not msm_params_for(1 << 18).grid(True) and msm_params_for(1 << 20).grid(True)  # small keys: XYZZ


# ------------------------------------------------------------------ grid batch-affine accumulation


def _ga(msm: Any, **kw: Any) -> Any:
    """Grid batch-affine params: tiny windows, chunks and thread counts, so a few hundred scalars
    make several chunks (runs across chunk boundaries), threads that walk several slots, and an
    inversion tree of several levels; blocks of 32 in the emulator."""
    emulated = getattr(msm, "cupy", None) is gpu_emu.fake_cupy
    base = {"ga_rounds": 3, "ga_g1": True, "ga_chunk": 500, "ga_threads": 70, "window_bits": 6,
            "nthreads": 32 if emulated else 128}
    return msm.MsmParams(**{**base, **kw})


@pytest.mark.parametrize("n", [1, 7, 300])
@pytest.mark.parametrize("dist", ["random", "porep", "same", "edge"])
def test_grid_affine_matches_arkworks(msm: Any, g2: bool, n: int, dist: str) -> None:
    """The grid batch-affine rounds (grid_affine.cuh) against arkworks: 0 / 1 / r - 1 scalars, one
    bucket for everything ("same"), sizes that are no multiple of a chunk, a slot or a thread count
    (300 scalars in 6-bit windows: ~13 K entries, 26 chunks of 500)."""
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + 71 + n)
    assert _run(msm, points, scalars, g2, _ga(msm)) == _oracle(points, scalars, g2), f"seed {SEED}"


@pytest.mark.parametrize("dist", ["random", "porep", "same"])
def test_grid_affine_special_bases(msm: Any, g2: bool, dist: str) -> None:
    """Infinity operands, P + P and P + (-P) in the grid rounds, for several round, chunk and thread
    counts (one thread for all slots; more threads than slots; an inversion tree of 3 levels;
    rounds 0: the list's XYZZ level 1 alone)."""
    points, scalars = _special(g2, dist)
    want = _oracle(points, scalars, g2)
    for rounds, chunk, threads in ((1, 64, 1), (2, 33, 1000), (3, 4096, 1500), (8, 10_000, 64), (0, 100, 8)):
        got = _run(msm, points, scalars, g2, _ga(msm, ga_rounds=rounds, ga_chunk=chunk, ga_threads=threads))
        assert got == want, f"seed {SEED} rounds {rounds} chunk {chunk} threads {threads}"


def test_grid_affine_repeated_and_opposite_pairs(msm: Any, g2: bool) -> None:
    """Every kind of pair (P + P, P + (-P), inf + P, P + inf) at every slot position of a round:
    all scalars 3, one digit in one window, so every entry is in one bucket (the ones' sum would
    take the XYZZ path)."""
    points = _pair_kinds(g2)
    scalars = ints_to_limbs([3] * len(points), 4)
    want = _oracle(points, scalars, g2)
    for chunk, threads in ((7, 2), (64, 5), (240, 1000)):
        got = _run(msm, points, scalars, g2, _ga(msm, ga_rounds=8, ga_chunk=chunk, ga_threads=threads))
        assert got == want, f"seed {SEED} chunk {chunk} threads {threads}"


@pytest.mark.parametrize("dist", ["edge"])
def test_grid_affine_with_multiples(kind: str, msm: Any, g2: bool, dist: str) -> None:
    """Grid rounds over precomputed multiples (one shared bucket set, several window batches); the
    "edge" scalars mix 0, 1, r - 1 and random ones."""
    n = 400
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + 81)
    for params in (_ga(msm), _ga(msm, max_entries=3 * n + 1, ga_chunk=128, ga_rounds=2)):
        obj = _with_multiples(kind, msm, points, g2, 7, dataclasses.replace(params, window_bits=None))
        assert obj.run(scalars) == _oracle(points, scalars, g2), f"seed {SEED} {params}"


@pytest.mark.parametrize("dist", ["random", "porep"])
def test_default_accumulation_matches_arkworks(msm: Any, g2: bool, dist: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default accumulation ("auto": an MSM object takes the grid rounds for G2, XYZZ for G1;
    the device plan turns them off for keys without B2 multiples) with the default chunk and
    thread counts, over several window batches."""
    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")
    n = 300
    points, scalars = _points(n, g2), _scalars(n, dist, SEED + 91)
    params = msm.MsmParams(window_bits=6, max_entries=3 * n + 1)
    assert params.grid(True) and not params.grid(False)
    assert _run(msm, points, scalars, g2, params) == _oracle(points, scalars, g2), f"seed {SEED}"


def test_grid_g2_mode_leaves_g1_on_xyzz(msm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUZK_GPU_MSM_ACCUMULATE=grid-g2: the G2 MSMs take the grid rounds, G1 the XYZZ kernel; "grid"
    both; an unknown mode is refused by name."""
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid-g2")
    p = msm.MsmParams()
    assert p.grid(True) and not p.grid(False) and not p.ga_where_fits
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid")
    assert msm.MsmParams().grid(False) and msm.MsmParams().grid(True)
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "xyzz")
    assert not msm.MsmParams().grid(True)
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "gird")
    with pytest.raises(ConfigError, match="CUZK_GPU_MSM_ACCUMULATE='gird'"):
        msm.MsmParams()


def test_grid_rounds_follow_the_mean_run(msm: Any) -> None:
    """log2 of the mean run, capped; no rounds where runs are single entries."""
    assert msm.grid_rounds_for(201 << 20, 1 << 21, 8) == 6
    assert msm.grid_rounds_for(1 << 20, 1, 8) == 8
    assert msm.grid_rounds_for(100, 1000, 8) == 0
    assert msm.grid_rounds_for(3, 1, 8) == 1
