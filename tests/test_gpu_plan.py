"""The GPU backend's device-memory plan (cuzk_mp/backends/gpu/plan.py): sizes, fallbacks, refusal.

The plans of PoRep-like keys at 2^24, 2^26 and 2^27 on a 139 GiB device (an H200) and on devices
too small; the point bytes against a real key's arrays; load_key on the emulated backend refusing a
key before any upload, and keeping to the in-flight count its plan chose.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.backends.gpu.msm_geometry import SECTIONS, window_count
from cuzk_mp.backends.gpu.msm_params import msm_params_for
from cuzk_mp.backends.gpu.plan import (
    DEFAULT_MARGIN,
    KeyShape,
    compute_scratch_bytes,
    largest_fitting_domain,
    msm_scratch_bytes,
    partition_bytes,
    plan_device,
)
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
from cuzk_mp.errors import DeviceMemoryError, ResourceError
from tests.gpu_emu.backend import fake_device

GIB = 1 << 30
H200_FREE = 139 * GIB


@pytest.fixture(autouse=True)
def xyzz_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes below are the XYZZ accumulation's; the grid rounds' lists (the default for G2)
    have their own tests, which set the mode themselves."""
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "xyzz")


def porep(log_n: int) -> KeyShape:
    c = synthetic_circuit("porep-like", log_n)
    return KeyShape(1 << log_n, c.n_wires, c.n_public)


def test_points_match_a_real_key(test_key: tuple[Path, Path]) -> None:
    """The plan's point bytes per section are the key file's section arrays' bytes (what load_key
    uploads), and its partition bytes the a, b, c, w shapes the backend stages."""
    from cuzk_mp.formats.zkey import read_zkey

    with read_zkey(test_key[0]) as zkey:
        shape = KeyShape.of(zkey)
        assert shape.section_bytes() == {s: int(getattr(zkey, s).nbytes) for s in SECTIONS}
        part = partition_bytes(shape)
        assert part["a"] == part["b"] == part["c"] == zkey.domain_size * 4 * 8
        assert part["w"] == zkey.n_vars * 4 * 8


def test_porep_2_24_on_an_h200_keeps_every_multiple() -> None:
    """2^24: the points (9 GiB) and all five multiples tables (c = 22: 11 more copies each) fit
    with two partitions in flight; the tables are the 107.6 GiB the H200 run measured as the
    key's device bytes."""
    plan = plan_device(porep(24), H200_FREE, workers=2, multiples="auto")
    assert plan.fits and plan.total <= H200_FREE and not plan.steps and plan.choice == "as configured"
    assert plan.multiples == {s: 22 for s in ("h", "b2", "a", "b1", "c")}
    assert plan.multiples_bytes == {s: (window_count(22) - 1) * plan.points[s] for s in plan.multiples}
    key = plan.points_total + sum(plan.multiples_bytes.values())
    assert 107 * GIB < key < 108 * GIB
    assert plan.in_flight == 2 and plan.total == (plan.resident + 2 * plan.partition_total + sum(plan.scratch.values())
                                                   + DEFAULT_MARGIN)


def test_porep_2_26_on_an_h200() -> None:
    """2^26: 36 GiB of points; the multiples of even one section (10 more copies) would not leave
    the partitions room, so "auto" takes none; three workers' partitions fit."""
    plan = plan_device(porep(26), H200_FREE, workers=3, multiples="auto")
    assert plan.fits and plan.multiples == {} and plan.in_flight == 3
    assert 35 * GIB < plan.points_total < 37 * GIB
    # asked for the multiples of h explicitly beside three partitions: they do not fit, and the
    # plan drops them; beside two they fit only with the radix sort's smaller buffers (without the G2
    # grid lists: 0.2 GiB to spare), not with cupy.argsort's, 2^26's sort
    forced = plan_device(porep(26), H200_FREE, workers=3, multiples="h")
    assert forced.multiples == {} and forced.steps == ["dropped the precomputed multiples of h"]
    assert forced.in_flight == 3 and forced.fits
    two = plan_device(porep(26), H200_FREE, workers=2, multiples="h")
    assert two.fits and two.multiples == {} and two.in_flight == 2 and two.large_sort == "argsort"
    radix = replace(msm_params_for(1 << 26), large_sort="radix")
    two = plan_device(porep(26), H200_FREE, workers=2, multiples="h", params=radix)
    assert two.fits and two.multiples == {"h": 24} and two.in_flight == 2


def test_porep_2_27_on_an_h200() -> None:
    """2^27: ~77 GB of points (72 GiB), no multiples; two partitions of 19 GiB in flight fit, a
    third does not, so a prover with three workers keeps two on the device."""
    shape = porep(27)
    plan = plan_device(shape, H200_FREE, workers=2, multiples="auto")
    assert 76e9 < plan.points_total < 78e9 and plan.multiples == {}
    assert plan.fits and plan.in_flight == 2 and not plan.steps
    assert 18 * GIB < plan.partition_total < 20 * GIB
    three = plan_device(shape, H200_FREE, workers=3, multiples="auto")
    assert three.in_flight == 2 and three.steps == ["2 partition(s) in flight instead of 3"]
    assert three.choice == "2 partition(s) in flight instead of 3" and three.fits
    assert "does NOT fit" not in three.summary() and "2 partition(s) in flight" in three.summary()
    # one more partition than the plan allows would not fit: the fallback was needed
    over = three.total + three.partition_total
    assert over > H200_FREE
    # multiples asked for on the 2^27 key go first, then the in-flight count
    both = plan_device(shape, H200_FREE, workers=3, multiples="h,b2")
    assert both.steps == ["dropped the precomputed multiples of b2", "dropped the precomputed multiples of h",
                          "2 partition(s) in flight instead of 3"]
    assert both.multiples == {} and both.in_flight == 2


def test_the_device_witness_map_rows_are_planned() -> None:
    """A key whose partitions come as w alone keeps its circuit's coded rows on the device: the plan
    counts them as resident (in its total, its summary and its refusal). Such a partition gets its
    a, b, c only when it computes, so the partitions staged beside the computing one count w alone:
    the rows cost the total what they weigh less a, b, c of the staged partition; a device that holds
    the key and two partitions without them keeps one partition in flight when the rows outweigh
    that, and a device that holds one partition only without them refuses, naming them."""
    shape = porep(27)
    plain = plan_device(shape, H200_FREE, workers=2)
    abc = sum(plain.per_partition[k] for k in "abc")
    assert plain.staged_total == plain.partition_total
    rows = 4 * GIB
    plan = plan_device(shape, H200_FREE, workers=2, witness_map=rows)
    assert plan.witness_map == rows and plan.resident == plain.resident + rows
    assert plan.staged_total == plan.partition_total - abc and plan.in_flight == 2
    assert plan.total == plain.total + rows - abc
    assert "witness map 4.0 GiB" in plan.summary() and "witness map" not in plain.summary()
    assert f"({plan.staged_total / GIB:.1f} GiB while staged)" in plan.summary()
    assert plan.as_dict()["witness_map"] == rows
    big = abc + rows  # rows that outweigh a, b, c of the staged partition
    free = plain.total  # exactly the need without the rows
    assert plan_device(shape, free, workers=2).in_flight == 2
    tight = plan_device(shape, free, workers=2, witness_map=big)
    assert tight.in_flight == 1 and tight.steps == ["1 partition(s) in flight instead of 2"] and tight.fits
    one = plan_device(shape, 10**15, workers=1).total
    with pytest.raises(DeviceMemoryError, match="witness map 4.00 GiB") as err:
        plan_device(shape, one, workers=1, witness_map=rows)
    assert "largest domain of this circuit's shape that fits is 2^26" in str(err.value)


def test_partitions_in_flight_peak_between_computations() -> None:
    """Between two computations every partition in flight may be whole at once (the next one's
    H step while the last one is being released) with no MSM running: the plan takes the larger of
    that and one computing partition with its scratch beside the staged ones."""
    from dataclasses import replace

    plan = plan_device(porep(27), H200_FREE, workers=2, witness_map=GIB)
    scratch = sum(plan.scratch.values())
    computing = plan.partition_total + plan.staged_total + scratch
    assert plan.in_flight_total == max(computing, 2 * plan.partition_total) == computing
    small = replace(plan, scratch={k: 0 for k in plan.scratch})
    assert small.in_flight_total == 2 * plan.partition_total > plan.partition_total + plan.staged_total


def test_a_batch_of_small_partitions_is_planned() -> None:
    """A prover worker stages a batch of small partitions and computes them in one pass: the plan
    counts ``workers`` batches in flight (one computing whole, the others staged) and, for a key of
    at most DENSE_KEY_ROWS rows, each section's batch as ONE batched pass (its scratch over k
    vectors and their concatenated copy), each on its stream of the pool, side by side."""
    from cuzk_mp.algebra.field import FR_BYTES
    from cuzk_mp.backends.gpu.msm_geometry import DENSE_KEY_ROWS
    from cuzk_mp.backends.gpu.msm_params import msm_params_for

    shape = porep(16)
    assert shape.domain_size <= DENSE_KEY_ROWS
    params = msm_params_for(shape.domain_size)
    one = plan_device(shape, H200_FREE, workers=2)
    eight = plan_device(shape, H200_FREE, workers=2, batch=8)
    assert eight.fits and not eight.steps and eight.choice == "as configured"
    assert (eight.batch, eight.batch_max, one.batch, one.batch_max) == (8, 8, 1, 1)
    rows = shape.rows()

    def batched_pass(s: str) -> int:
        m = rows[s]
        return msm_scratch_bytes(8 * m, s == "b2", params, vectors=8) + 8 * m * FR_BYTES

    # five sections, five streams of the pool: every pass alive at once
    assert eight.scratch == {"msm_g1": sum(batched_pass(s) for s in SECTIONS if s != "b2"),
                             "msm_g2": batched_pass("b2"), "c_plan": 8 * rows["c"]}
    assert eight.per_partition == one.per_partition and eight.staged_total == eight.partition_total
    scratch = sum(eight.scratch.values())
    assert eight.in_flight_total == max(8 * eight.partition_total + 8 * eight.staged_total + scratch,
                                        16 * eight.partition_total)
    assert eight.total == eight.resident + eight.in_flight_total + DEFAULT_MARGIN
    assert eight.total > one.total and eight.in_flight_total - one.in_flight_total > 14 * one.partition_total
    assert "2 partition(s) in flight in batches of 8" in eight.summary()
    assert eight.as_dict()["batch"] == 8 and eight.as_dict()["batch_max"] == 8


def test_unbatched_msms_of_a_batch_are_counted_per_stream() -> None:
    """Above DENSE_KEY_ROWS the backend enqueues a batch's MSMs one per partition: a key of at most
    2^18 rows each on a stream of the pool (8 a thread: with 8 partitions every stream runs a G2
    MSM, the largest, and C's cut of eight plans), a larger key's on two streams, one MSM after
    another (the scratch of one partition's pass; the batch counts in the partitions alone)."""
    from cuzk_mp.backends.gpu.msm_geometry import MSM_STREAMS
    from cuzk_mp.backends.gpu.msm_params import msm_params_for

    shape = porep(18)
    params = msm_params_for(shape.domain_size)
    rows = shape.rows()
    plan = plan_device(shape, H200_FREE, workers=2, batch=8)
    g2 = msm_scratch_bytes(rows["b2"], True, params)
    assert plan.scratch == {"msm_g1": 0, "msm_g2": MSM_STREAMS * g2, "c_plan": 8 * 8 * rows["c"]}
    alone = plan_device(shape, H200_FREE, workers=2)  # five MSMs, five streams
    assert alone.scratch == {"msm_g1": sum(msm_scratch_bytes(rows[s], False, params) for s in SECTIONS if s != "b2"),
                             "msm_g2": g2, "c_plan": 8 * rows["c"]}
    big = KeyShape(1 << 20, 1 << 20, 1)  # w alone: a 32 MiB segment, batched by the prover
    wmap = 1 << 30
    b8, b1 = (plan_device(big, H200_FREE, workers=2, batch=k, witness_map=wmap) for k in (8, 1))
    assert b8.scratch == b1.scratch == compute_scratch_bytes(big, {}, msm_params_for(big.domain_size))
    scratch = sum(b8.scratch.values())
    assert b8.in_flight_total == max(8 * b8.partition_total + 8 * b8.staged_total + scratch, 16 * b8.partition_total)
    assert b8.in_flight_total > b1.in_flight_total


def test_a_tight_device_takes_smaller_batches_before_fewer_partitions() -> None:
    """Where the batch does not fit, the plan drops the multiples first, then takes smaller batches
    (a step each, said in ``steps`` and ``choice``), and lowers the partitions in flight only once a
    batch is one partition; the refusal is the one of a batch of one."""
    shape = porep(16)
    every = ",".join(SECTIONS)
    need = {k: plan_device(shape, 10**15, workers=2, batch=k).total for k in range(1, 9)}
    assert all(need[k] < need[k + 1] for k in range(1, 8))
    free = need[5]  # room for batches of 5, without multiples
    plan = plan_device(shape, free, workers=2, batch=8, multiples=every)
    assert plan.fits and plan.batch == 5 and plan.in_flight == 2 and plan.multiples == {}
    dropped = [f"dropped the precomputed multiples of {s}" for s in ("c", "b1", "a", "b2", "h")]
    assert plan.steps == dropped + [f"batches of {j} partition(s) instead of 8" for j in (7, 6, 5)]
    assert plan.choice == ("without the precomputed multiples of c, b1, a, b2, h; "
                           "batches of 5 partition(s) instead of 8")
    assert plan.total == need[5] and plan_device(shape, 10**15, workers=2, batch=8).total > free
    # below a batch of one for two workers: one partition in flight
    lone = plan_device(shape, need[1] - 1, workers=2, batch=8)
    assert lone.batch == 1 and lone.in_flight == 1 and lone.fits
    assert lone.steps[-2:] == ["batches of 1 partition(s) instead of 8", "1 partition(s) in flight instead of 2"]
    assert lone.choice == "batches of 1 partition(s) instead of 8; 1 partition(s) in flight instead of 2"
    # nothing fits: the same refusal as without a batch
    tiny = plan_device(shape, 10**15, workers=1).total - 1
    with pytest.raises(DeviceMemoryError) as with_batch:
        plan_device(shape, tiny, workers=2, batch=8)
    with pytest.raises(DeviceMemoryError) as without:
        plan_device(shape, tiny, workers=2)
    assert str(with_batch.value) == str(without.value)


def test_multiples_already_made_are_kept_by_the_fallbacks() -> None:
    """The plan of a key after its upload counts the multiples made (``made``): where they do not
    fit with every partition as asked, it takes smaller batches and fewer partitions in flight and
    keeps them (they are on the device), where a plan before the upload drops them first; and a
    refusal names them."""
    shape = porep(16)
    need = {k: plan_device(shape, 10**15, workers=2, batch=k, multiples="h", made=True).total for k in (1, 8)}
    free = need[8] - 1
    before = plan_device(shape, free, workers=2, batch=8, multiples="h")
    assert before.multiples == {} and before.steps[0] == "dropped the precomputed multiples of h"
    after = plan_device(shape, free, workers=2, batch=8, multiples="h", made=True)
    assert after.fits and list(after.multiples) == ["h"]
    assert after.batch < 8 and not any("multiples" in st for st in after.steps)
    lone = plan_device(shape, need[1] - 1, workers=2, batch=8, multiples="h", made=True)
    assert lone.fits and lone.multiples and (lone.batch, lone.in_flight) == (1, 1)
    with pytest.raises(DeviceMemoryError, match="with the precomputed multiples of h \\(made\\) and one partition"):
        plan_device(shape, plan_device(shape, 10**15, workers=1, multiples="h", made=True).total - 1,
                    workers=2, multiples="h", made=True)


def test_packed_b_sections_at_2_27_on_an_h200() -> None:
    """2^27 with the PoRep-like key's B1 and B2 packed to the 45 % of wires its B side uses: the
    points drop by the rest (~20 GiB), each partition carries the packed scalars and their index
    lists, and the key keeps two partitions in flight beside its device witness map's rows, ~19 GiB
    below the whole sections' plan."""
    from dataclasses import replace

    whole = porep(27)
    k = int(0.45 * whole.n_vars)
    packed = replace(whole, packed=(("b2", k), ("b1", k)))
    assert packed.rows()["b2"] == packed.rows()["b1"] == packed.support == k and packed.rows()["a"] == whole.n_vars
    rows = 4 * GIB
    p = plan_device(packed, H200_FREE, workers=2, witness_map=rows)
    w = plan_device(whole, H200_FREE, workers=2, witness_map=rows)
    assert p.in_flight == 2 and p.fits and not p.steps and w.in_flight <= p.in_flight
    assert p.total < w.total - 16 * GIB
    assert w.points_total - p.points_total == (whole.n_vars - k) * (96 + 192)
    assert p.support_rows == 4 * k and w.support_rows == 0
    assert p.per_partition["w_support"] == 32 * k and p.per_partition["w_support_plan"] == 8 * k
    assert p.scratch["msm_g2"] < w.scratch["msm_g2"]
    assert f"b2, b1 packed to {k} rows of {whole.n_vars}" in p.summary() and p.as_dict()["packed"] == {"b2": k, "b1": k}
    assert packed.scaled(1 << 26).support == k // 2 or abs(packed.scaled(1 << 26).support - k / 2) <= 1


def test_grid_lists_go_before_any_multiple(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default accumulation ("auto"): G2's MSM plans the grid rounds' lists where they fit as
    configured. The packed 2^24 key keeps them beside every multiple, the packed 2^26 key beside
    two partitions; above 2^26 rows "auto" keeps XYZZ by rule (no fallback step), even where they
    fit ("grid-g2" keeps them there: 2^27 whose partitions come as w alone); where they do not fit
    ("grid-g2" at 2^27 with a, b, c staged from the host and two partitions in flight, or a device
    with room for the XYZZ plan
    alone) they go first, before any multiple or partition, and the plan hands the backend params
    without them; small keys plan none."""
    from dataclasses import replace

    from cuzk_mp.backends.gpu.msm_params import MsmParams, msm_params_for
    from cuzk_mp.backends.gpu.plan import NO_GRID, grid_list_bytes

    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")
    configured = MsmParams()
    assert configured.grid(True) and not configured.grid(False)
    xyzz = replace(configured, ga_rounds=0)

    def packed(lg: int) -> KeyShape:
        whole = porep(lg)
        k = int(0.45 * whole.n_vars)
        return replace(whole, packed=(("b2", k), ("b1", k)))

    p24 = plan_device(packed(24), H200_FREE, workers=2, multiples="auto")
    assert p24.fits and not p24.steps and not p24.grid_off and len(p24.multiples) == 5
    assert p24.msm_params(configured) is configured
    base = compute_scratch_bytes(packed(24), p24.multiples, xyzz)["msm_g2"]
    assert p24.scratch["msm_g2"] - base == grid_list_bytes(configured.ga_chunk, True, configured) > 20 * GIB

    p26 = plan_device(packed(26), H200_FREE, workers=2, multiples="auto", witness_map=2 * GIB)
    assert p26.fits and p26.in_flight == 2 and not p26.grid_off and not p26.steps and not p26.multiples
    assert p26.msm_params(configured) == replace(configured, large_sort="argsort")  # 2^26's sort, grid kept

    # 2^27 with the device witness map (the staged partition holds w alone): the lists fit beside two
    # partitions, and "grid-g2" keeps them; "auto" (the default) keeps XYZZ above 2^26 by rule (no step)
    mapped = plan_device(packed(27), H200_FREE, workers=2, multiples="auto", witness_map=4 * GIB)
    assert mapped.fits and mapped.in_flight == 2 and mapped.grid_off and not mapped.steps
    assert not mapped.msm_params(configured).grid(True)
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid-g2")
    asked = plan_device(packed(27), H200_FREE, workers=2, multiples="auto", witness_map=4 * GIB)
    assert asked.fits and asked.in_flight == 2 and not asked.grid_off and not asked.steps
    assert asked.msm_params(MsmParams()).grid(True)
    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")
    # without it (a, b, c staged from the host) the lists do not fit beside two partitions
    p27 = plan_device(packed(27), H200_FREE, workers=2, multiples="auto")
    assert p27.fits and p27.in_flight == 2 and p27.grid_off and not p27.steps and p27.choice == "as configured"
    assert not p27.msm_params(configured).grid(True) and p27.msm_params(xyzz) is xyzz
    assert p27.total == plan_device(packed(27), H200_FREE, workers=2, params=xyzz).total
    # "grid-g2" asked for: the lists do not fit beside two partitions, so they go (a fallback)
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid-g2")
    forced = plan_device(packed(27), H200_FREE, workers=2, multiples="auto")
    assert forced.grid_off and forced.steps == [NO_GRID] and NO_GRID in forced.choice and forced.in_flight == 2
    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")

    # room for the key, its multiples and the XYZZ scratch alone: the lists go, the multiples stay
    # ("auto": by rule; "grid-g2": the logged fallback)
    tight = plan_device(packed(24), H200_FREE, workers=2, multiples="auto", params=xyzz)
    named = ",".join(tight.multiples)  # the same tables whatever the free memory ("auto" sizes them to it)
    for mode, steps in (("auto", []), ("grid-g2", [NO_GRID])):
        monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", mode)
        off = plan_device(packed(24), tight.total, workers=2, multiples=named)
        assert off.fits and off.steps == steps and off.grid_off and off.multiples == tight.multiples, mode
        assert off.total == tight.total and off.in_flight == 2
    monkeypatch.delenv("CUZK_GPU_MSM_ACCUMULATE")

    # a small key's MSMs keep XYZZ (msm_params_for): its plan counts no lists
    small = porep(16)
    assert not msm_params_for(small.domain_size).grid(True)
    assert plan_device(small, H200_FREE).scratch == compute_scratch_bytes(
        small, {}, replace(msm_params_for(small.domain_size), ga_rounds=0))


def test_too_small_device_is_refused_with_the_sizes() -> None:
    """2^27 on 80 GiB: not even one partition without multiples fits; the error names the need,
    the free memory and the largest domain of this shape that fits (2^26)."""
    shape = porep(27)
    with pytest.raises(DeviceMemoryError) as err:
        plan_device(shape, 80 * GIB, workers=2, multiples="auto")
    text = str(err.value)
    one = plan_device(shape, 10**15, workers=1)  # the need with every fallback taken
    assert f"needs {one.total / GIB:.2f} GiB" in text and "only 80.00 GiB is free" in text
    assert "largest domain of this circuit's shape that fits is 2^26" in text
    assert isinstance(err.value, ResourceError)
    assert largest_fitting_domain(shape, 80 * GIB) == 1 << 26
    assert plan_device(porep(26), 80 * GIB, workers=1).fits
    with pytest.raises(DeviceMemoryError, match="not even a 2-row domain"):
        plan_device(KeyShape(1 << 12, 1 << 12, 1), 1 << 20)


def test_msm_scratch_follows_the_window_geometry() -> None:
    """Dense 2^27 G1: c = 22, 12 windows, batches of 2 windows (max_entries 2^28): the sort's
    bytes per key dominate; G2's XYZZ buckets are twice G1's; multiples with c = 24 keep two
    bucket sets of 2^23."""
    from cuzk_mp.backends.gpu.msm_geometry import choose_window, window_count
    from cuzk_mp.backends.gpu.msm_params import MsmParams

    n = 1 << 27
    g1, g2 = msm_scratch_bytes(n, False), msm_scratch_bytes(n, True)
    assert 9 * GIB < g1 < g2 < 13 * GIB
    assert msm_scratch_bytes(n, False, MsmParams(max_entries=1 << 27)) < g1  # fewer keys alive at once
    # the combine levels: two alive at a time in a plain run (each frees its input), all in a graph
    heads = -(-(1 << 28) // MsmParams().seg) * (2 * 96 + 4)
    assert msm_scratch_bytes(n, False, captured=True) - g1 > heads // 4 > 0  # levels 3, 4, ..: ~half the heads more
    grid = MsmParams(ga_rounds=8, ga_chunk=1 << 20)
    # the grid rounds' lists: one chunk of 2^20 entries of a batch's 2^28 (2 windows of 2^27 scalars)
    assert msm_scratch_bytes(n, True, grid) - msm_scratch_bytes(n, True) == (1 << 20) * (8 + 4 + 2 * (192 + 4)) + (
        1 << 19) * (4 + 16 + 96)
    g2_only = MsmParams(ga_rounds=8, ga_chunk=1 << 20, ga_g1=False)  # "grid-g2": G1 plans its XYZZ scratch alone
    assert msm_scratch_bytes(n, False, g2_only) == g1
    assert msm_scratch_bytes(n, True, g2_only) == msm_scratch_bytes(n, True, grid)
    small = window_count(choose_window(100)) * 100  # a batch smaller than a chunk: a chunk of its keys
    assert msm_scratch_bytes(100, False, grid) - msm_scratch_bytes(100, False) == small * (8 + 4 + 2 * (96 + 4)) + (
        -(-small // 2)) * (4 + 16 + 48)
    with_mult = msm_scratch_bytes(1 << 20, False, multiples_c=24)
    assert with_mult > 2 * (1 << 23) * 192
    shape = porep(27)
    scratch = compute_scratch_bytes(shape, {})
    # the largest G1 MSM is H's (domain_size scalars > n_vars); G2 runs over n_vars
    assert scratch == {"msm_g1": g1, "msm_g2": msm_scratch_bytes(shape.n_vars, True), "c_plan": 8 * shape.rows()["c"]}


def test_graphs_are_planned_and_dropped_first() -> None:
    """A small key whose MSMs run as CUDA graphs plans the graphs' buffers (GRAPH_RUNS per section
    of its largest captured pass); where they do not fit, the first fallback runs the MSMs without
    graphs, before any multiple is dropped or any partition leaves the device."""
    from dataclasses import replace

    from cuzk_mp.backends.gpu.msm_params import GRAPH_MAX_ENTRIES, GRAPH_RUNS, MsmParams
    from cuzk_mp.backends.gpu.plan import COUNTING_SORT_BYTES_PER_KEY, graph_bytes

    shape = porep(12)
    params = MsmParams(seg=4, combine_seg=2, group=2, bucket_chunk_min=2, graphs=True)
    roomy = plan_device(shape, H200_FREE, workers=2, multiples="auto", graph_params=params)
    assert roomy.graphs and roomy.steps == [] and roomy.scratch["msm_graphs"] == graph_bytes(shape, roomy.multiples,
                                                                                                params)
    m, c = shape.rows()["b2"], roomy.multiples["b2"]
    k = min(8, GRAPH_MAX_ENTRIES // (m * window_count(c)))
    g2_run = msm_scratch_bytes(k * m, True, params, c, COUNTING_SORT_BYTES_PER_KEY)
    assert g2_run < msm_scratch_bytes(k * m, True, params, c)  # the counting sort's 12 B per key, not the radix's
    assert roomy.scratch["msm_graphs"] >= GRAPH_RUNS * g2_run >= 1 << 20
    assert graph_bytes(shape, roomy.multiples, replace(params, graphs=False)) == 0
    assert "msm_graphs" not in plan_device(shape, H200_FREE, workers=2, multiples="auto").scratch
    every = ",".join(SECTIONS)
    roomy = plan_device(shape, H200_FREE, workers=2, multiples=every, graph_params=params)
    tight = roomy.total - roomy.scratch["msm_graphs"] // 2
    fallback = plan_device(shape, tight, workers=2, multiples=every, graph_params=params)
    assert fallback.fits and not fallback.graphs and fallback.steps == ["MSMs without CUDA graphs"]
    assert fallback.multiples == roomy.multiples and fallback.in_flight == 2 and "msm_graphs" not in fallback.scratch
    assert fallback.choice == "MSMs without CUDA graphs"


# ---------------------------------------------------------------- load_key on the emulated backend


def test_load_key_refuses_before_any_upload(emu: object, test_key: tuple[Path, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A key that does not fit the (fake) device's free memory fails in load_key with the plan's
    message, and nothing was uploaded."""
    from cuzk_mp.formats.zkey import read_zkey

    uploads: list[int] = []
    monkeypatch.setattr(emu.key_load, "_upload_release", lambda dst, src, stream, **kw: uploads.append(src.nbytes) or 0)
    backend = emu.GpuBackend(0, in_flight=2)  # type: ignore[attr-defined]
    try:
        with read_zkey(test_key[0]) as zkey:
            one = plan_device(KeyShape.of(zkey), 10**15, workers=1)
            fake_device(monkeypatch, emu, backend, one.total - 1)
            with pytest.raises(DeviceMemoryError, match=r"needs .* GiB of device memory .* is free; the largest "
                                                         r"domain of this circuit's shape that fits is 2\^9"):
                backend.load_key(zkey)
        assert uploads == []
    finally:
        backend.close()


def test_load_key_plans_the_batch_and_caps_it(emu: object, test_key: tuple[Path, Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """load_key plans the batch it is given: where a batch of 8 does not fit the (fake) device,
    the key's plan takes smaller batches and the backend's ``batch_limit`` says how many a worker may
    stage together; a key loaded with no batch (its partitions go alone), with room for its points
    beside the first key's batches, leaves the cap as it is."""
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.formats.zkey import read_zkey

    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")
    monkeypatch.setenv("CUZK_GPU_MSM_GRAPHS", "0")
    assert CpuBackend.batch_limit is None  # the CPU backend has no device plan: no cap
    backend = emu.GpuBackend(0, in_flight=2)  # type: ignore[attr-defined]
    keys: list[Any] = []
    try:
        assert backend.batch_limit is None
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            three = plan_device(shape, 10**15, workers=2, batch=3)
            fake_device(monkeypatch, emu, backend, three.total + three.resident - three.ntt_tables)
            keys.append(backend.load_key(zkey, batch=8))
            plan = keys[0].plan
            assert plan.batch == 3 and plan.batch_max == 8 and plan.in_flight == 2 and backend.batch_limit == 3
            assert plan.steps[-1] == "batches of 3 partition(s) instead of 8"
            keys.append(backend.load_key(zkey))
            assert keys[1].plan.batch == keys[1].plan.batch_max == 1 and backend.batch_limit == 3
    finally:
        for key in keys:
            key.close()
        backend.close()


@pytest.mark.slow
def test_load_key_keeps_to_the_planned_in_flight_count(emu: object, test_key: tuple[Path, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory for one partition in flight but not two: load_key drops the multiples and
    lowers the in-flight count; a second thread's stage waits until the first partition is
    released, while the thread that holds one may stage another (a batch never waits for itself)."""
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from tests.helpers import LOG_N

    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "auto")
    backend = emu.GpuBackend(0, in_flight=2)  # type: ignore[attr-defined]
    try:
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            one = plan_device(shape, 10**15, workers=1)
            fake_device(monkeypatch, emu, backend, one.total + one.partition_total // 2)
            key = backend.load_key(zkey)
            assert key.plan.in_flight == 1 and key.multiples == {} and backend.in_flight_limit == 1
            assert key.plan.steps[-1] == "1 partition(s) in flight instead of 2"
            from cuzk_mp.circuits.synthetic import PorepLike

            inputs = ConstraintEvaluator.from_zkey(zkey).evaluate(PorepLike(LOG_N).witness(7, 0))
            first = backend.stage(key, inputs)
            second = backend.stage(key, inputs)  # the same thread: no wait
            backend.release(second)
            got: list[object] = []
            t = threading.Thread(target=lambda: got.append(backend.stage(key, inputs)))
            t.start()
            time.sleep(0.5)
            assert not got and t.is_alive()  # waits for the first partition's place
            backend.release(first)
            t.join(30)
            assert len(got) == 1
            backend.release(got[0])
            key.close()
    finally:
        backend.close()


def test_large_batch_sort_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUZK_GPU_MSM_SORT picks how batches above the counting sort's buckets are sorted; the plan
    counts cupy.argsort's larger buffers when it is picked, and an unknown value is refused by name."""
    from cuzk_mp.backends.gpu.env_knobs import SORT_ENV
    from cuzk_mp.backends.gpu.msm_params import MsmParams
    from cuzk_mp.backends.gpu.plan import ARGSORT_BYTES_PER_KEY, SORT_BYTES_PER_KEY
    from cuzk_mp.errors import ConfigError

    monkeypatch.delenv(SORT_ENV, raising=False)
    assert MsmParams().large_sort == "radix"
    monkeypatch.setenv(SORT_ENV, " ArgSort ")
    argsort = MsmParams()
    assert argsort.large_sort == "argsort"
    m = 1 << 26
    radix = MsmParams(large_sort="radix")
    extra = msm_scratch_bytes(m, False, argsort) - msm_scratch_bytes(m, False, radix)
    entries = min(window_count(22), radix.max_entries // m) * m
    assert ARGSORT_BYTES_PER_KEY > SORT_BYTES_PER_KEY
    assert extra == entries * (ARGSORT_BYTES_PER_KEY - SORT_BYTES_PER_KEY)
    monkeypatch.setenv(SORT_ENV, "bitonic")
    with pytest.raises(ConfigError, match="CUZK_GPU_MSM_SORT='bitonic'"):
        MsmParams()
    with pytest.raises(ConfigError, match="large_sort"):
        MsmParams(large_sort="merge")


@pytest.mark.parametrize(("log_n", "env", "want"), [
    (24, None, "radix"), (25, None, "argsort"), (26, None, "argsort"), (27, None, "radix"),
    (26, "radix", "radix"), (27, "argsort", "argsort")])
def test_each_key_size_gets_the_sort_measured_fastest(monkeypatch: pytest.MonkeyPatch, log_n: int, env: str | None,
                                                      want: str) -> None:
    """The plan picks the large window batches' sort by the key's domain (cupy.argsort at 2^25 and 2^26,
    the radix sort elsewhere: measured in the pipeline), counts that sort's buffers, and hands it to
    every section's MSM parameters; env CUZK_GPU_MSM_SORT overrides the rule."""
    from cuzk_mp.backends.gpu.env_knobs import SORT_ENV
    from cuzk_mp.backends.gpu.msm_params import msm_params_for

    if env is None:
        monkeypatch.delenv(SORT_ENV, raising=False)
    else:
        monkeypatch.setenv(SORT_ENV, env)
    n = 1 << log_n
    shape = KeyShape(n, n, 1)
    plan = plan_device(shape, 1 << 40)
    assert plan.large_sort == want
    for points in (n, n // 3):  # a packed section's points: the key's rule all the same
        assert plan.msm_params(msm_params_for(points)).large_sort == want
    other = "radix" if want == "argsort" else "argsort"
    counted = plan_device(shape, 1 << 40, params=replace(plan.msm_params(msm_params_for(n)), large_sort=other))
    assert sum(plan.scratch.values()) != sum(counted.scratch.values())  # the sort's own buffers are counted


def test_a_section_bigger_than_the_domain_brings_no_grid_lists_the_plan_never_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A key of 2^16 rows (the small keys' MSM parameters: XYZZ, no grid rounds) with 2^19 wires: its B2
    section has more points than the domain, and the default parameters of that many points have grid
    rounds; the plan gives them back without (it counted no lists), as keys of at most 2^18 rows keep
    XYZZ."""
    from cuzk_mp.backends.gpu.msm_params import msm_params_for
    from cuzk_mp.backends.gpu.plan import KeyShape, plan_device

    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "grid")  # rounds for both groups, wherever they fit
    plan = plan_device(KeyShape(1 << 16, 1 << 19, 1), 64 << 30, workers=2)
    assert msm_params_for(1 << 19).ga_rounds > 0 and msm_params_for(1 << 16).ga_rounds == 0
    assert plan.msm_params(msm_params_for(1 << 19)).ga_rounds == 0
    big = plan_device(KeyShape(1 << 24, 1 << 24, 1), 139 << 30, workers=2)  # a key whose plan has the rounds
    assert not big.grid_off and big.msm_params(msm_params_for(1 << 24)).ga_rounds == msm_params_for(1 << 24).ga_rounds


@pytest.mark.parametrize("with_multiples", [False, True])
def test_the_graphs_buffers_in_the_plan_match_what_a_batched_pass_allocates(with_multiples: bool,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured graph keeps every allocation of its pass: the plan's count of one batched small-key
    pass (k vectors, each its windows' bucket sets, the reduction's shares) against the bytes the MSM
    module allocates on the emulator for it (within 10 %)."""
    import types

    import numpy as np
    from py_arkworks_bls12381 import G1Point, Scalar

    from cuzk_mp.algebra import curve
    from cuzk_mp.algebra.field import R_MOD, ints_to_limbs
    from cuzk_mp.backends.gpu.msm_geometry import choose_multiples_window, window_count
    from cuzk_mp.backends.gpu.msm_params import graph_batch_limit, msm_params_for
    from cuzk_mp.backends.gpu.plan import COUNTING_SORT_BYTES_PER_KEY, msm_scratch_bytes
    from tests import gpu_emu

    msm = gpu_emu.load("msm")
    fixed_base = gpu_emu.load("fixed_base")
    allocated = [0]

    def counted(fn: Any) -> Any:
        def alloc(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            allocated[0] += int(out.nbytes)
            return out
        return alloc

    fake = types.SimpleNamespace(**vars(gpu_emu.fake_cupy))
    for name in ("empty", "zeros", "concatenate", "arange", "cumsum"):
        setattr(fake, name, counted(getattr(gpu_emu.fake_cupy, name)))
    monkeypatch.setattr(msm, "cupy", fake)
    monkeypatch.setitem(msm._MsmPasses._sort.__globals__, "cupy", fake)  # the passes allocate too
    m, k = 256, 8
    params = msm_params_for(m)
    points = np.stack([curve.g1_ark_to_lem(G1Point() * Scalar(3 + i)) for i in range(m)])
    if with_multiples:
        c = choose_multiples_window(m)
        table = fixed_base.multiples_table(points, c, window_count(c))
        obj = msm.MsmG1(table[:m], params, msm.Multiples(table, c, window_count(c), m))
    else:
        obj = msm.MsmG1(points, params)
        c = obj._window_bits(m)
    assert k <= graph_batch_limit(m, c)
    rng = np.random.default_rng(5)
    scalars = np.asarray(ints_to_limbs([int(x) % R_MOD for x in rng.integers(1, 2**62, k * m)], 4))
    allocated[0] = 0
    no_marks = gpu_emu.load("msm_host")._NoMarks()
    obj._pippenger(scalars, None, k * m, m, no_marks)  # what a captured graph of the pass holds
    planned = msm_scratch_bytes(k * m, False, params, c if with_multiples else None, COUNTING_SORT_BYTES_PER_KEY,
                                captured=True, vectors=k)
    assert 0.9 * allocated[0] <= planned <= 1.5 * allocated[0], (planned, allocated[0])
