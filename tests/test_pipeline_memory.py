"""Host memory bounded by the ring: the memory model's shapes for a few machines, and a real bench
whose synthesis workers are watched from outside the engine (their private memory must not grow
with the partition: w, a, b, c are written into the ring slot, never copied)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import psutil
import pytest

from cuzk_mp.errors import ConfigError
from cuzk_mp.pipeline import bench, benchoptions
from cuzk_mp.pipeline.memory import (
    FEED_MARGIN, READY_PER_PROVER, GiB, MiB, Shape, derive_shape, device_seconds, estimated_circuit_size, explain_shape,
    host_bound, host_budget_bytes, model_working_sets, ready_per_prover, synthesis_cores, synthesis_seconds,
)
from cuzk_mp.pipeline.segment import partition_segment_bytes
from cuzk_mp.pipeline.types import default_synthesis_threads
from tests.helpers import KEY_CACHE

POREP_24 = estimated_circuit_size(1 << 24, (1 << 24) - 300)  # a PoRep-like partition at 2^24 rows
POREP_26 = estimated_circuit_size(1 << 26, (1 << 26) - 300)
POREP_18 = estimated_circuit_size(1 << 18, (1 << 18) - 300)


@pytest.mark.parametrize("machine, cores, ram, backend, provers, circuit, want", [
    ("2 cores, 24 GiB, CPU backend", 2, 24 * GiB, "cpu", 1, POREP_18, Shape(3, 2, 1)),
    ("16 cores, 128 GiB, one H200", 16, 128 * GiB, "gpu", 1, POREP_24, Shape(5, 2, 7)),
    ("16 cores, 128 GiB, one H200, 2^26", 16, 128 * GiB, "gpu", 1, POREP_26, Shape(5, 2, 7)),
    ("64 cores, 512 GiB, 4 GPUs", 64, 512 * GiB, "gpu", 4, POREP_24, Shape(19, 7, 8)),
    ("64 cores, 512 GiB, 4 GPUs, 2^26", 64, 512 * GiB, "gpu", 4, POREP_26, Shape(19, 7, 8)),
])
def test_shape_for_a_machine_fits_its_budget(machine: str, cores: int, ram: int, backend: str, provers: int,
                                             circuit, want: Shape) -> None:  # type: ignore[no-untyped-def]
    budget = host_budget_bytes("auto", "host_budget", total=ram)
    assert budget == ram - 4 * GiB
    choice = explain_shape(budget, circuit, cores=cores, backend=backend, provers=provers, prover_workers=2)
    shape = choice.shape
    assert shape == want, (machine, choice.reason)
    assert derive_shape(budget, circuit, cores=cores, backend=backend, provers=provers) == shape
    bound = host_bound(shape, circuit, provers, model_working_sets(circuit, backend, 2), backend=backend)
    assert bound.total <= budget and bound == choice.bound
    assert bound.ring == shape.ring_slots * partition_segment_bytes(circuit.domain_size, circuit.n_vars)
    # no core is given twice: the synthesis threads fit the cores the provers leave
    assert shape.partition_workers * shape.threads_per_partition <= synthesis_cores(cores, backend, provers)
    if backend == "gpu":
        # the GPUs are fed: synthesis outruns the devices by the margin, every worker has a slot, and each
        # prover one to stage and a ready queue
        assert choice.synthesis_rate >= FEED_MARGIN * choice.device_rate > 0, choice.reason
        assert choice.synthesis_rate == pytest.approx(
            shape.partition_workers / synthesis_seconds(circuit, shape.threads_per_partition))
        assert shape.ring_slots >= shape.partition_workers + 2 * provers
        # the target: peak host memory <= ring_slots x segment + the key + 4 GiB
        assert bound.total <= bound.ring + circuit.key_bytes + 4 * GiB, bound.as_dict()
    if provers == 1 and backend == "gpu":
        assert shape.ring_slots <= 6


def test_throughput_model_against_the_h200_measurements() -> None:
    """The model's synthesis and device times against what the H200 box measured at 2^24 (the pipeline's
    median stages: 5 threads 0.666 s, 8 threads 0.457 s; device 0.367 s)."""
    assert synthesis_seconds(POREP_24, 1) == pytest.approx(1.95)
    assert synthesis_seconds(POREP_24, 5) == pytest.approx(0.666, rel=0.02)
    assert synthesis_seconds(POREP_24, 8) == pytest.approx(0.457, rel=0.02)
    assert synthesis_seconds(POREP_24, 4) == pytest.approx(0.777, rel=0.05)  # synthesis_bench, 4 threads
    assert synthesis_seconds(POREP_24, 16) >= 0.221  # 16 threads: the model stays on the slow side
    assert device_seconds(POREP_24) == pytest.approx(0.367)
    assert synthesis_seconds(POREP_26, 7) == pytest.approx(4 * synthesis_seconds(POREP_24, 7))


def test_budget_takes_ready_slots_then_workers_then_slots_away() -> None:
    """Throughput does not depend on the budget while the ready queue fits (24 to 96 GiB at 2^24 give
    one shape); below that the queue shrinks first, then a worker goes (the other gets its threads),
    then slots; too small a budget is refused naming the key."""
    shapes = {gib: derive_shape(gib * GiB, POREP_24, cores=16, backend="gpu", provers=1) for gib in (24, 48, 96)}
    assert set(shapes.values()) == {Shape(5, 2, 7)}
    assert derive_shape(12 * GiB, POREP_24, cores=16, backend="gpu", provers=1) == Shape(4, 2, 7)
    assert derive_shape(8 * GiB, POREP_24, cores=16, backend="gpu", provers=1) == Shape(2, 1, 14)
    tight = explain_shape(8 * GiB, POREP_24, cores=16, backend="gpu", provers=1)
    assert tight.bound.total <= 8 * GiB and tight.synthesis_rate >= tight.device_rate  # fewer slots, still fed
    kept = derive_shape(124 * GiB, POREP_24, cores=16, backend="gpu", provers=1,
                        given={"ring_slots": 6, "threads_per_partition": 4})
    assert (kept.ring_slots, kept.threads_per_partition) == (6, 4)
    # the workers are still derived: enough at 4 threads each to feed the device, and more of them at 2
    assert kept.partition_workers / synthesis_seconds(POREP_24, 4) >= 1 / device_seconds(POREP_24)
    thinner = derive_shape(124 * GiB, POREP_24, cores=16, backend="gpu", provers=1,
                           given={"ring_slots": 6, "threads_per_partition": 2})
    assert thinner.partition_workers > kept.partition_workers
    with pytest.raises(ConfigError, match="memory.host_budget.*smallest pipeline"):
        derive_shape(4 * GiB, POREP_24, cores=16, backend="gpu", provers=1)


def test_the_ring_fits_the_shared_memory_tmpfs() -> None:
    """A ring the tmpfs it lives in cannot hold kills its writers with SIGBUS: the shape leaves the
    segments room in ``shm_bytes`` as in the host budget, and a ring that cannot shrink enough (or
    is given) is refused naming /dev/shm and the key (or the bench's option)."""
    seg = POREP_24.segment_bytes
    roomy = derive_shape(96 * GiB, POREP_24, cores=16, backend="gpu", provers=1)
    capped = derive_shape(96 * GiB, POREP_24, cores=16, backend="gpu", provers=1, shm_bytes=3 * seg + seg // 2)
    assert roomy.ring_slots > 3 and capped.ring_slots == 3
    with pytest.raises(ConfigError, match=r"pipeline.ring_slots: /dev/shm holds .* less than the 2 ring slots"):
        derive_shape(96 * GiB, POREP_24, cores=16, backend="gpu", provers=1, shm_bytes=seg)
    with pytest.raises(ConfigError, match=r"^--ring-slots: /dev/shm holds"):
        explain_shape(96 * GiB, POREP_24, cores=16, backend="gpu", provers=1, shm_bytes=seg,
                      given={"ring_slots": 6}, keys=("--host-budget", "--ring-slots"))
    with pytest.raises(ConfigError, match=r"^--host-budget: .* smallest pipeline"):
        explain_shape(4 * GiB, POREP_24, cores=16, backend="gpu", provers=1, keys=("--host-budget", "--ring-slots"))


def test_the_bench_refuses_a_given_ring_the_tmpfs_cannot_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """All three of the shape's options given: the ring must still fit /dev/shm, refused with the
    shape's own message as an input error of the option."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.pipeline import memory

    seg = POREP_24.segment_bytes
    machine = memory.Machine(cores=16, memory_bytes=256 * GiB)
    monkeypatch.setattr(memory, "shm_capacity_bytes", lambda: 3 * seg)

    def shape(slots: int) -> str:
        args = argparse.Namespace(ring_slots=slots, partition_workers=2, synthesis_threads=4, host_budget=None,
                                  gpu_workers=2)
        return benchoptions.choose_shape(args, "gpu", POREP_24, machine, [0])

    assert shape(3).startswith("shape: all given, checked for 2^24 rows, host budget auto (RAM - 4 GiB): ")
    with pytest.raises(InputError, match=r"^--ring-slots: /dev/shm holds .* less than the 4 ring slots of "):
        shape(4)


def test_the_bench_checks_a_shape_given_whole_against_the_memory_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """All three of the shape's options given: the bench still runs the memory model on that shape,
    reports its bound against the budget, and refuses a shape whose bound exceeds it (the auto budget,
    RAM - 4 GiB, or --host-budget), as it refuses a derived one; --host-budget lets a shape through."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.pipeline import memory

    monkeypatch.setattr(memory, "shm_capacity_bytes", lambda: None)
    machine = memory.Machine(cores=16, memory_bytes=32 * GiB)

    def shape(slots: int, budget: str | None = None) -> str:
        args = argparse.Namespace(ring_slots=slots, partition_workers=2, synthesis_threads=4, host_budget=budget,
                                  gpu_workers=2)
        line = benchoptions.choose_shape(args, "gpu", POREP_24, machine, [0])
        assert (args.ring_slots, args.partition_workers, args.synthesis_threads) == (slots, 2, 4)  # kept
        return line

    ws = model_working_sets(POREP_24, "gpu", 2, ring_slots=4)
    fits = host_bound(Shape(4, 2, 4), POREP_24, 1, ws, backend="gpu").total
    assert fits < 28 * GiB
    line = shape(4)
    assert line.startswith("shape: all given, checked for 2^24 rows, host budget auto (RAM - 4 GiB): ")
    assert f"model bound {fits / GiB:.1f} GiB of a 28.0 GiB budget" in line
    with pytest.raises(InputError, match=r"^--host-budget \(auto: RAM - 4 GiB\): 28\.00 GiB cannot hold the pipeline "
                                         r"given for this circuit \(.* 16 ring slots .*\); raise it, or lower "
                                         r"--ring-slots, --partition-workers and --synthesis-threads$"):
        shape(16)
    with pytest.raises(InputError, match=r"^--host-budget: 8\.00 GiB cannot hold the pipeline given"):
        shape(4, "8GiB")
    assert "model bound" in shape(16, "96GiB")


def test_auto_budgets_follow_the_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container or a unit with MemoryMax= the limit, not the machine's RAM, is what "auto" may
    use: the process's own cgroup's limit (a systemd unit's), or an ancestor's, whichever is lowest."""
    from cuzk_mp.pipeline import memory

    ram = psutil.virtual_memory().total
    root = tmp_path / "cgroup"
    unit = root / "system.slice" / "cuzk-mp.service"
    unit.mkdir(parents=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/system.slice/cuzk-mp.service\n")
    monkeypatch.setattr(memory, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(memory, "PROC_CGROUP", str(proc))
    (root / "memory.max").write_text("max\n")
    (unit / "memory.max").write_text("max\n")
    assert memory.machine_memory_bytes() == ram
    (unit / "memory.max").write_text(f"{900 * MiB}\n")  # MemoryMax=900M on the unit: the root says max
    assert memory.machine_memory_bytes() == min(ram, 900 * MiB)
    assert host_budget_bytes("auto", "x") == max(0, min(ram, 900 * MiB) - 4 * GiB)
    (root / "system.slice" / "memory.max").write_text(f"{700 * MiB}\n")  # a lower limit on its slice
    assert memory.machine_memory_bytes() == min(ram, 700 * MiB)


def test_cgroup_limit_files_of_both_hierarchies() -> None:
    from cuzk_mp.pipeline.memory import cgroup_limit_files

    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/user.slice/session-1.scope\n"
    assert cgroup_limit_files(text, "/cg") == [
        "/cg/memory/docker/abc/memory.limit_in_bytes", "/cg/memory/docker/memory.limit_in_bytes",
        "/cg/memory/memory.limit_in_bytes",
        "/cg/user.slice/session-1.scope/memory.max", "/cg/user.slice/memory.max", "/cg/memory.max"]
    assert cgroup_limit_files("0::/\n", "/cg") == ["/cg/memory.max"]  # a container's own namespace
    assert cgroup_limit_files("garbage\n", "/cg") == []


def test_batched_small_partitions_get_a_full_batch_ready_per_worker() -> None:
    """Partitions small enough to batch: the ring keeps a full batch READY for each prover worker
    (with 3 slots a prover the second worker of a batching prover finds nothing); a large partition,
    or no batching, keeps the usual queue; given slots are kept."""
    small = estimated_circuit_size(1 << 16, (1 << 16) - 300)
    base = derive_shape(100 * GiB, small, cores=16, backend="gpu", provers=1, prover_workers=2)
    batched = derive_shape(100 * GiB, small, cores=16, backend="gpu", provers=1, prover_workers=2, batch=8)
    assert batched.ring_slots == batched.partition_workers + 1 + 2 * 8
    assert base.ring_slots == base.partition_workers + 1 + READY_PER_PROVER
    assert derive_shape(100 * GiB, POREP_24, cores=16, backend="gpu", provers=1, batch=8) == Shape(5, 2, 7)
    assert ready_per_prover(small, 2, 8) == 16 and ready_per_prover(POREP_24, 2, 8) == READY_PER_PROVER
    assert derive_shape(100 * GiB, small, cores=16, backend="gpu", provers=1, batch=8,
                        given={"ring_slots": 6}).ring_slots == 6


def _private(pid: int) -> tuple[int, int] | None:
    """(anonymous, USS) bytes of a process, read from its smaps_rollup by this test itself."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]}
    return kb["Anonymous"] * 1024, (kb["Private_Clean"] + kb["Private_Dirty"]) * 1024


@pytest.mark.slow
def test_synthesis_workers_hold_no_copy_of_a_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench at 2^16 (ring 2, two workers); a sampler outside the engine reads each synthesis
    worker's private memory: after the first job (circuit loaded), it grows by less than a small
    fixed allowance while partitions go through, though each partition is an 8 MiB segment.

    The children run with a fixed malloc mmap threshold, so that a big array freed after a
    partition goes back to the system instead of staying in the heap's high-water mark: their
    anonymous memory then shows what they hold, and a private copy of a partition would show.
    """
    allowance = 4 * MiB
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))  # glibc: fixed, not raised on free
    samples: dict[int, list[tuple[float, int, int]]] = {}
    stop = threading.Event()

    def sample() -> None:
        me = psutil.Process()
        while not stop.is_set():
            for child in me.children(recursive=True):
                try:
                    if not child.name().startswith("cuzk-synth"):
                        continue
                except psutil.NoSuchProcess:
                    continue
                got = _private(child.pid)
                if got is not None:
                    samples.setdefault(child.pid, []).append((time.monotonic(), *got))
            time.sleep(0.01)

    out = tmp_path / "bench.json"
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "--backend", "cpu", "--log-n", "16", "--partitions", "2", "--jobs", "2",
                              "--in-flight", "1", "--partition-workers", "2", "--ring-slots", "2",
                              "--cache", str(KEY_CACHE), "--json", str(out), "--quiet"])
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        assert args.func(args) == 0
    finally:
        stop.set()
        watcher.join(5)
    result = json.loads(out.read_text())
    bound = result["memory_bound"]
    segment = bound["segment_bytes"]
    assert segment > 2 * allowance  # a private copy of one partition could not hide in the allowance
    first_job_done = min(max(p["t_done_mono"] for p in result["partitions"] if p["job"] == job)
                         for job in {p["job"] for p in result["partitions"]})
    assert len(samples) == 2
    for pid, rows in samples.items():
        # with one job in flight, every worker is idle when the first job completes: its baseline
        _, anon0, uss0 = [r for r in rows if r[0] <= first_job_done][-1]
        later = [r for r in rows if r[0] > first_job_done]
        assert len(later) > 10, f"worker {pid}: too few samples after the first job"
        grew = max(r[1] for r in later) - anon0
        assert grew <= allowance, f"worker {pid}: anonymous memory grew {grew} bytes over a partition"
        # USS also counts the slot's pages while the worker writes them: at most one segment on top
        grew = max(r[2] for r in later) - uss0
        assert grew <= segment + allowance, f"worker {pid}: USS grew {grew} bytes"
    # the whole tree (PSS, shared pages once) plus the ring's shm stayed under the model's bound
    assert bound["peak_host_bytes"] <= bound["model_bound_bytes"], bound["model_bound_parts"]
    assert bound["ring_margin_bytes"] >= 0 and result["peak_live_segments"] <= 2
    assert result["proofs_verified"] == result["proofs_total"] == 4
    assert set(result["peak_uss_by_process"]) >= {"cuzk-synth-0", "cuzk-synth-1", "cuzk-prover-0"}
    assert result["config"]["synthesis_threads"] == default_synthesis_threads(2, cpu_provers=1)


def test_a_prover_lets_the_key_coefficients_go(test_key) -> None:  # type: ignore[no-untyped-def]
    """Reading a key validates section 4 and so faults it in; a prover process never reads it again and
    lets its pages go (a 2^24 key's 2.8 GB were the prover's idle memory on the H200 box). The data
    stays readable: the pages come back from the file."""
    import numpy as np

    from cuzk_mp.backends.gpu.hostmem import PAGE, mapped_rss
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.pipeline.key_cache import drop_coefficient_pages

    with read_zkey(test_key[0]) as zkey:
        coefs = np.array(zkey.coefs)  # a private copy to compare with
        assert zkey.coefs.nbytes > 4 * PAGE
        before = mapped_rss([zkey.a])  # the key file's mapping: every section this process touched
        released = drop_coefficient_pages(zkey)
        assert released >= zkey.coefs.nbytes - 2 * PAGE
        assert before - mapped_rss([zkey.a]) >= released - PAGE
        np.testing.assert_array_equal(zkey.coefs, coefs)


def test_cpu_prover_working_set_grows_with_its_batch() -> None:
    """A CPU prover worker stages a whole batch of small partitions (a private copy each) and its pass
    holds every one's H vector: the model counts a full batch for each worker; partitions too large to
    batch, and the GPU backend (staged from the segment), are unchanged by the batch cap."""
    from cuzk_mp.pipeline.memory import CPU_BATCH_BYTES_PER_ROW, CPU_PROVER_BYTES_PER_ROW
    from cuzk_mp.pipeline.types import BATCH_MAX_BYTES

    assert 0 < POREP_18.segment_bytes <= BATCH_MAX_BYTES < POREP_24.segment_bytes
    one, eight = model_working_sets(POREP_18, "cpu", 2, 1), model_working_sets(POREP_18, "cpu", 2, 8)
    assert one.prover == 2 * POREP_18.segment_bytes + CPU_PROVER_BYTES_PER_ROW * POREP_18.domain_size
    assert eight.prover - one.prover == 2 * 7 * POREP_18.segment_bytes + 7 * CPU_BATCH_BYTES_PER_ROW * (1 << 18)
    # measured on the 2-core machine (2^18, batch 8): the prover grew by 758 MB from idle; the model covers it
    assert eight.prover >= 758 * 10**6
    assert model_working_sets(POREP_24, "cpu", 2, 8) == model_working_sets(POREP_24, "cpu", 2, 1)
    assert model_working_sets(POREP_18, "gpu", 2, 8) == model_working_sets(POREP_18, "gpu", 2, 1)
    # a pass takes READY slots: never more partitions than the ring has slots
    assert model_working_sets(POREP_18, "cpu", 2, 8, ring_slots=3) == model_working_sets(POREP_18, "cpu", 2, 3)
    assert model_working_sets(POREP_18, "cpu", 2, 8, ring_slots=16) == eight
    # the shape derivation sizes the CPU pipeline with the batch it will run, in the ring it derives
    budget = 24 * GiB
    batched = explain_shape(budget, POREP_18, cores=2, backend="cpu", batch=8)
    slots = batched.shape.ring_slots
    assert batched.bound.provers == model_working_sets(POREP_18, "cpu", 2, min(8, slots)).prover
    assert batched.bound.total <= budget


def test_sizes_are_written_in_one_way() -> None:
    from cuzk_mp.logs import fmt_bytes

    assert [fmt_bytes(x) for x in (59 * GiB, 1.5 * 2**20, 3 * 2**10, None)] == ["59.00 GiB", "1.5 MiB", "3 KiB", "n/a"]
