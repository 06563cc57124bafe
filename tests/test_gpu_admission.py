"""The device admission (cuzk_mp/backends/gpu/admission.py): the resident keys' plans together set
how many partitions of any keys are in flight and in what batches, at every key load and close."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.backends.gpu.admission import admit
from cuzk_mp.backends.gpu.plan import DEFAULT_MARGIN, KeyShape, plan_device
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
from tests.gpu_emu.backend import fake_device


@pytest.fixture(autouse=True)
def xyzz_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes with the XYZZ accumulation, no multiples and no graphs: the plans below are the
    same whatever the defaults."""
    monkeypatch.setenv("CUZK_GPU_MSM_ACCUMULATE", "xyzz")
    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")
    monkeypatch.setenv("CUZK_GPU_MSM_GRAPHS", "0")


def porep(log_n: int) -> KeyShape:
    c = synthetic_circuit("porep-like", log_n)
    return KeyShape(1 << log_n, c.n_wires, c.n_public)


def test_one_key_alone_is_admitted_as_its_plan() -> None:
    """For one key, the admission is the key's plan: the same in-flight count, batch and total,
    fallbacks included."""
    shape = porep(12)
    for k, workers in ((1, 2), (8, 2), (8, 3)):
        roomy = plan_device(shape, 10**15, workers=workers, batch=k)
        half = plan_device(shape, 10**15, workers=workers, batch=max(1, k // 2)).total
        for free in (roomy.total, roomy.total - roomy.partition_total, half, half - roomy.partition_total):
            plan = plan_device(shape, free, workers=workers, batch=k)
            alone = admit([plan], free, workers=workers)
            assert (alone.in_flight, alone.batch, alone.total) == (plan.in_flight, plan.batch, plan.total)
            assert alone.steps == plan.steps and alone.fits


def test_a_key_planned_in_another_keys_room_is_admitted_with_both() -> None:
    """A large key fits the device exactly with two partitions in flight; a small key loaded next
    plans against the memory free then, which is the large key's room for its partitions: each plan
    fits alone, but with both keys resident the large key's two partitions overcommit the device by the
    small key's points. Admitted together: one partition in flight, the large key's, and it fits."""
    big, small = porep(14), porep(12)
    free = plan_device(big, 10**15, workers=2).total
    b = plan_device(big, free, workers=2)
    a = plan_device(small, free - b.resident, workers=2)
    assert b.fits and b.in_flight == 2 and a.fits and a.in_flight == 2
    per_key = min(b.in_flight, a.in_flight)  # the limits as each key's plan alone sets them
    assert b.resident + a.resident + plan_device(big, 10**15, workers=per_key).in_flight_total + DEFAULT_MARGIN > free
    together = admit([b, a], free, workers=2)
    assert together.fits and together.in_flight == 1 and together.steps == ["1 partition(s) in flight instead of 2"]
    assert together.in_flight_total == plan_device(big, 10**15, workers=1).in_flight_total  # the large key's
    assert together.summary().startswith("device plan of 2 resident key(s) (2^14, 2^12): keys ")
    assert together.summary().endswith("free: fits; 1 partition(s) in flight instead of 2")
    short = admit([b, a], plan_device(big, 10**15, workers=1).total + a.resident - 1, workers=2)
    assert not short.fits and short.in_flight == 1
    assert "need" in short.refusal() and "evict a key first" in short.refusal()


def test_batches_of_any_key_count_the_largest() -> None:
    """A batched small key's batches and an unbatched large key's partitions: the in-flight bytes
    are those of the larger of either (a worker's batch may be of any key)."""
    big, small = porep(14), porep(10)
    b = plan_device(big, 10**15, workers=2)
    a = plan_device(small, 10**15, workers=2, batch=8)
    together = admit([b, a], 10**15, workers=2)
    assert together.batch == 8 and together.batch_limit == 8 and together.batch_of(b) == 1
    assert together.in_flight_total >= max(a.in_flight_total, b.in_flight_total)
    assert admit([b], 10**15, workers=2).batch_limit is None  # no batched key: no cap


def _load(backend: Any, zkey: Any, batch: int) -> Any:
    return backend.load_key(zkey, batch=batch)


def test_a_key_loaded_beside_another_keeps_the_first_keys_batches_within_the_device(
        emu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose partitions are batched fills the (fake) device with two batches of 8 in flight;
    a second key (its partitions alone) is loaded into what is free then, the first key's room for
    its batches. The backend's limits keep the first key's batches within the device with both
    keys' points resident (planned alone, each key would leave batches of 8: over the device)."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    keys: list[Any] = []
    try:
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            device = plan_device(shape, 10**15, workers=2, batch=8).total
            fake_device(monkeypatch, emu, backend, device)
            keys.append(_load(backend, zkey, 8))
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 8)
            keys.append(_load(backend, zkey, 1))
            second = keys[1].plan
            assert second.fits and second.in_flight == 2 and second.steps == []  # it fits alone
            n, k = backend.in_flight_limit, backend.batch_limit
            need = plan_device(shape, 10**15, workers=n, batch=k).total + second.resident - second.ntt_tables
            assert need <= device, f"{n} batches of {k} in flight overcommit the device"
            assert (n, k) == (2, 7)
    finally:
        for key in keys:
            key.close()
        backend.close()


def test_closing_a_key_gives_its_room_back_to_the_limits(emu: Any, test_key: tuple[Path, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two keys whose partitions are batched, resident together, share the device with smaller
    batches than the first one alone; once the second key is closed (evicted), the limits are those
    of the first alone again, and a close that leaves no key lifts them."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    keys: list[Any] = []
    try:
        with read_zkey(test_key[0]) as zkey:
            fake_device(monkeypatch, emu, backend, plan_device(KeyShape.of(zkey), 10**15, workers=2, batch=8).total)
            keys.append(_load(backend, zkey, 8))
            alone = (backend.in_flight_limit, backend.batch_limit)
            assert alone == (2, 8)
            keys.append(_load(backend, zkey, 8))
            assert backend.batch_limit is not None and backend.batch_limit < 8
            keys[1].close()
            assert (backend.in_flight_limit, backend.batch_limit) == alone
            keys[0].close()
            assert (backend.in_flight_limit, backend.batch_limit) == (2, None)
    finally:
        for key in keys:
            key.close()
        backend.close()


@pytest.fixture(scope="module")
def larger_key() -> Path:
    """The zkey of the test circuit at twice its domain (porep-like 2^11), made once per machine."""
    from cuzk_mp.pipeline.keys import ensure_synthetic_key
    from tests.helpers import KEY_CACHE

    return ensure_synthetic_key("porep-like", 11, KEY_CACHE, "cpu")[0]


def test_closing_the_last_key_of_a_domain_frees_its_ntt_tables(
        emu: Any, test_key: tuple[Path, Path], larger_key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NTT engine keeps one set of tables per domain size. A small key fills the (fake) device
    with two batches of 8; a larger key is loaded beside it (smaller batches), then closed: its
    domain's tables leave the device with it, and the small key's limits are those it has alone
    again (kept, the larger domain's tables would hold its batches below what the device fits)."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    keys: list[Any] = []
    try:
        with read_zkey(test_key[0]) as small, read_zkey(larger_key) as large:
            device = plan_device(KeyShape.of(small), 10**15, workers=2, batch=8).total
            fake_device(monkeypatch, emu, backend, device)
            keys.append(_load(backend, small, 8))
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 8)
            keys.append(_load(backend, large, 1))
            assert backend.ntt_engine.domain_sizes() == [1 << 10, 1 << 11]
            assert backend.batch_limit is not None and backend.batch_limit < 8
            keys[1].close()
            assert backend.ntt_engine.domain_sizes() == [1 << 10]
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 8)
            keys[0].close()
            assert backend.ntt_engine.domain_sizes() == []
            assert emu.memory.free_bytes()[0] == device  # nothing left on the device
    finally:
        for key in keys:
            key.close()
        backend.close()


def _no_room_for(emu: Any, monkeypatch: pytest.MonkeyPatch, section: str) -> None:
    """Make the emulated device refuse the precomputed multiples of ``section`` at upload, as a
    device whose free memory went meanwhile would (ResourceError from memory.ensure_free)."""
    from cuzk_mp.errors import ResourceError

    ensure_free = emu.memory.ensure_free

    def refusing(need: int, what: str, margin: int = DEFAULT_MARGIN) -> None:
        if what == f"precomputed multiples of key section {section}":
            raise ResourceError(f"{what}: no room (test)")
        ensure_free(need, what, margin)

    monkeypatch.setattr(emu.memory, "ensure_free", refusing)


def test_a_multiples_table_that_finds_no_room_is_planned_without(
        emu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key's batches of 8 fit the (fake) device exactly with the multiples of h, whose windows
    make its MSMs' scratch smaller than the table; the table finds no room at upload, so h's MSMs
    run without it, with their larger scratch: the key's plan is made again without it, and its
    batches are those that fit so (kept, the plan of a table that is not there would leave batches
    of 8, over the device)."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    key = None
    try:
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            device = plan_device(shape, 10**15, workers=2, batch=8, multiples="h").total
            bare = plan_device(shape, device, workers=2, batch=8)
            assert bare.batch == 7  # without the table, batches of 8 do not fit
            fake_device(monkeypatch, emu, backend, device)
            _no_room_for(emu, monkeypatch, "h")
            monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "h")
            key = _load(backend, zkey, 8)
            assert key.multiples == {} and key.msms["h"].multiples is None
            assert key.plan.multiples == {} and key.plan.total == bare.total
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 7)
    finally:
        if key is not None:
            key.close()
        backend.close()


def test_a_multiples_table_that_finds_no_room_leaves_its_room_to_the_partitions(
        emu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose partitions go alone, planned with the multiples of h (here the table outweighs
    the scratch its windows save), whose table finds no room at upload: its plan no longer counts
    it, and a key loaded beside it whose partitions are batched keeps batches of 8 (with the
    table counted, 7)."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    keys: list[Any] = []
    try:
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            with_h = plan_device(shape, 10**15, workers=2, multiples="h")
            bare = plan_device(shape, 10**15, workers=2)
            batched = plan_device(shape, 10**15, workers=2, batch=8)
            assert with_h.total > bare.total
            device = batched.total + bare.resident - bare.ntt_tables
            assert admit([with_h, batched], device, workers=2).batch == 7
            fake_device(monkeypatch, emu, backend, device)
            _no_room_for(emu, monkeypatch, "h")
            monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "h")
            keys.append(_load(backend, zkey, 1))
            assert keys[0].multiples == {} and keys[0].plan.multiples == {}
            monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")
            keys.append(_load(backend, zkey, 8))
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 8)
    finally:
        for key in keys:
            key.close()
        backend.close()


def test_a_key_loaded_beside_others_drops_its_multiples_before_their_partitions(
        emu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose partitions are batched fills the (fake) device with two batches of 8 beside the
    points of a second key; the second key, asked with the multiples of h, would fit them alone
    (its own plan keeps them) but only by taking a partition off the first key's batches: it is
    loaded without them, and the batches stay of 8."""
    from cuzk_mp.formats.zkey import read_zkey

    backend = emu.GpuBackend(0, in_flight=2)
    keys: list[Any] = []
    try:
        with read_zkey(test_key[0]) as zkey:
            shape = KeyShape.of(zkey)
            first = plan_device(shape, 10**15, workers=2, batch=8)
            second = plan_device(shape, 10**15, workers=2)
            device = first.total + second.resident - second.ntt_tables
            fake_device(monkeypatch, emu, backend, device)
            keys.append(_load(backend, zkey, 8))
            monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "h")
            alone = plan_device(shape, emu.memory.free_bytes()[0], workers=2, multiples="h")
            assert alone.multiples and alone.steps == []  # its own plan keeps them
            assert admit([first, alone], device, workers=2).batch < 8
            keys.append(_load(backend, zkey, 1))
            assert keys[1].multiples == {} and keys[1].plan.multiples == {}
            assert (backend.in_flight_limit, backend.batch_limit) == (2, 8)
    finally:
        for key in keys:
            key.close()
        backend.close()
