"""``cuzk-mp bench`` through the real pipeline on the CPU backend, at the smallest size."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from cuzk_mp.errors import FormatError, InputError
from cuzk_mp.logs import fmt_bytes
from cuzk_mp.pipeline import bench, benchoptions, benchrun, benchsummary
from cuzk_mp.pipeline.shm_names import shm_entries

from tests.helpers import KEY_CACHE, LOG_N

REQUIRED = ("s_per_partition", "s_per_partition_runs", "s_per_job", "s_per_job_runs", "s_per_proof", "s_per_proof_runs",
            "first_job_s", "proofs_total", "proofs_verified", "peak_host_bytes",
            "peak_shm_bytes", "peak_live_segments", "gpu_busy_fraction", "median_stage_s", "partitions",
            "partitions_by_device", "machine", "memory_bound", "median_device_split_s")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    bench.add_parser(sub)
    return parser.parse_args(["bench", *argv])


def test_bench_runs_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "2", "--jobs", "3", "--in-flight", "2",
                  "--partition-workers", "1", "--devices", "0,1", "--ring-slots", "2", "--repeat", "2",
                  "--cache", str(KEY_CACHE), "--json", str(out))
    assert args.func(args) == 0
    text = capsys.readouterr()
    assert "s/partition (steady state)" in text.out and "s/job of 2 partitions (steady)" in text.out
    assert "proofs verified" in text.out and "12 / 12" in text.out
    assert "12/12 proofs" in text.err  # the progress bar
    result = json.loads(out.read_text())
    assert all(k in result for k in REQUIRED)
    assert result["proofs_total"] == result["proofs_verified"] == 12
    assert len(result["s_per_partition_runs"]) == 2 and result["s_per_partition"] > 0 and result["first_job_s"] > 0
    assert result["s_per_proof"] == result["s_per_partition"]  # the former name, kept as an alias
    assert result["s_per_proof_runs"] == result["s_per_partition_runs"]
    # per whole job: the steady per-partition rate times the 2 partitions a job has, run by run
    assert len(result["s_per_job_runs"]) == 2 and result["s_per_job"] > 0
    for s_job, s_part in zip(result["s_per_job_runs"], result["s_per_partition_runs"]):
        assert s_job == pytest.approx(2 * s_part)
    assert result["gpu_busy_fraction"] is None  # cpu backend
    assert result["median_device_split_s"] == {}  # the CPU backend keeps no split of its own
    assert 1 <= result["peak_live_segments"] <= 2  # never more segments than ring slots
    assert result["peak_host_bytes"] >= result["peak_shm_bytes"]
    assert sum(result["partitions_by_device"].values()) == 12
    assert {p["device"] for p in result["partitions"]} <= {0, 1}
    # per-device accounting (here with two simulated devices): each prover's
    # device-stage seconds in the steady window per second of it: the union of its placed stages,
    # so at most 1 however late the messages that place them
    busy = result["device_busy_fraction_by_device"]
    assert set(busy) <= {"0", "1"} and busy and all(0 < f <= 1 for f in busy.values()), busy
    bound = result["memory_bound"]
    assert bound["segment_bytes"] > 0 and bound["bound_bytes"] == bound["peak_host_bytes"] + bound["margin_bytes"]
    assert len(bound["peak_host_bytes_by_job"]) == 6  # one window per job completion, both runs
    for per_process in ("peak_pss_by_process", "peak_uss_by_process", "idle_pss_by_process"):
        assert set(bound[per_process]) >= {"engine", "cuzk-synth-0", "cuzk-prover-0", "cuzk-prover-1"}
    assert set(result["peak_uss_by_process"]) == set(bound["peak_uss_by_process"])  # USS beside the PSS peak
    assert min(bound[k] for k in ("synth_working_set_bytes", "prover_working_set_bytes", "fixed_bytes")) >= 0
    assert all(b is not None for b in bound["peak_host_bytes_by_job"])
    # the bound is predicted from the first job and checked on the rest; at this size the working sets
    # are a few MiB and allocator noise moves the peak by a few hundred KiB, hence the result's tolerance
    # (benchsummary.BOUND_TOLERANCE), which the table states where the peak went over the bound
    assert bound["bound_check"] in ("held", "within tolerance"), bound
    assert (f"over by {fmt_bytes(-bound['margin_bytes'])} (within the {fmt_bytes(bound['tolerance_bytes'])} "
            "tolerance)" if bound["margin_bytes"] < 0 else f"(margin {fmt_bytes(bound['margin_bytes'])};") in text.out
    assert bound["ring_margin_bytes"] >= 0  # live shm never exceeded ring_slots segments + control objects
    # the model alone (what the daemon's budget and --host-budget use) also holds the measured peak
    assert bound["model_bound_check"] == "held" and bound["model_margin_bytes"] >= 0, bound["model_bound_parts"]
    assert result["config"]["synthesis_threads"] >= 1 and result["synthesis_core_s"] > 0
    assert result["machine"]["cores"] >= 1
    assert shm_entries(f"cuzk-bench-{os.getpid()}") == []


def test_bench_dense_random_circuit_with_the_derived_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The second synthetic kind through the whole pipeline (its dev key, synthesis, proofs that verify),
    with no shape flags: the first lines say the backend and why, the machine, and the shape derived for
    it through the memory model, which is the shape that ran."""
    from cuzk_mp.pipeline.memory import circuit_size, explain_shape, host_budget_bytes, machine_memory_bytes

    out = tmp_path / "dense.json"
    args = _parse("--backend", "cpu", "--circuit", "dense-random", "--log-n", str(LOG_N), "--partitions", "2",
                  "--jobs", "2", "--in-flight", "2", "--cache", str(KEY_CACHE), "--json", str(out), "--quiet")
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["config"]["circuit"] == "dense-random"
    assert result["proofs_total"] == result["proofs_verified"] == 4
    assert (KEY_CACHE / f"dense-random-{LOG_N}.zkey").is_file()
    first, second = capsys.readouterr().out.splitlines()[:2]
    ram = machine_memory_bytes()  # the RAM, or the cgroup's limit where lower
    assert first.startswith("cuzk-mp bench: cpu backend (--backend cpu); 1 CPU prover process(es)")
    assert f"{os.cpu_count()} cores, {ram / 2**30:.1f} GiB host memory" in first
    assert second.startswith(f"shape: derived for 2^{LOG_N} rows, host budget auto (RAM - 4 GiB): ")
    want = explain_shape(host_budget_bytes("auto", "x", total=ram),
                         circuit_size(KEY_CACHE / f"dense-random-{LOG_N}.zkey"), backend="cpu", provers=1)
    assert want.reason in second
    c = result["config"]
    assert (c["ring_slots"], c["partition_workers"], c["synthesis_threads"]) == (
        want.shape.ring_slots, want.shape.partition_workers, want.shape.threads_per_partition)
    assert c["shape_reason"] == second and c["backend_reason"] == "--backend cpu"


def _fake_nvidia_smi(folder: Path, lines: str) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    tool.chmod(0o755)


def test_backend_choice_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto without a GPU says so; with an NVIDIA GPU that CuPy cannot use it says why before the CPU runs."""
    import importlib.util

    from cuzk_mp import backends

    monkeypatch.setattr(backends, "gpu_available", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert benchoptions.choose_backend("auto") == ("cpu",
                                                   "--backend auto: no NVIDIA GPU on this machine (no nvidia-smi)")
    assert benchoptions.choose_backend("cpu") == ("cpu", "--backend cpu")
    _fake_nvidia_smi(tmp_path, "0, NVIDIA H200, 143771\\n")
    assert benchoptions._gpu_table() == {0: ("NVIDIA H200", 143771 * 2**20)}
    backend, why = benchoptions.choose_backend("auto")
    assert backend == "cpu" and "this machine has 1 NVIDIA GPU(s) but CuPy" in why and "falling back" in why
    missing = importlib.util.find_spec("cupy") is None
    assert ("not installed" in why) == missing and ("sees no CUDA device" in why) == (not missing)
    with pytest.raises(InputError, match=r"--backend gpu: CuPy (is not installed|is installed but sees no CUDA)"):
        benchoptions.choose_backend("gpu")  # asked for outright: no CPU fallback, the reason instead
    monkeypatch.setattr(backends, "gpu_available", lambda: True)
    assert benchoptions.choose_backend("auto") == ("gpu", "--backend auto: CuPy sees a GPU")
    machine = benchoptions.machine_for("gpu", [0])
    assert machine.gpus == (("NVIDIA H200", 143771 * 2**20),) and machine.cores == os.cpu_count()
    assert "GPU 0 NVIDIA H200 (140 GiB)" in benchoptions.machine_line("gpu", "x", machine, [0])


def test_plot_without_matplotlib_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib, --plot stops before any work with a message saying what to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    args = _parse("--backend", "cpu", "--plot", str(tmp_path / "t.png"), "--cache", str(tmp_path / "nothing"))
    with pytest.raises(InputError, match="matplotlib"):
        args.func(args)
    assert not (tmp_path / "nothing").exists()  # no key was made: it stopped first


def test_steady_figures_per_partition_and_per_job() -> None:
    """Three jobs of 2 partitions finishing 10, 14 and 20 s after the start: the cold first job is
    apart; per job (20 - 10) / 2 jobs; per partition the later partitions' window over their count;
    one job alone: its own time."""
    run = benchrun.RunResults(t_start=100.0)
    run.results = [argparse.Namespace(job_id=j) for j in ("j0", "j1", "j2")]
    run.t_done = {"j0": 110.0, "j1": 114.0, "j2": 120.0}
    part_done = {("j0", 0): 109.0, ("j0", 1): 110.0, ("j1", 0): 112.0, ("j1", 1): 114.0,
                 ("j2", 0): 118.0, ("j2", 1): 120.0}
    assert benchsummary.steady_s_per_job(run, part_done, 2) == 5.0
    assert benchsummary.steady_s_per_proof(run, part_done, 2) == 2.5  # 4 partitions in (110, 120]
    lone = benchrun.RunResults(t_start=100.0, t_done={"j0": 107.0})
    assert benchsummary.steady_s_per_job(lone, {}, 2) == 7.0
    # a window that opens on partitions proved before it (j1's batch ended with j0): never faster
    # than the pipeline's capacity
    part_done.update({("j1", 0): 110.0, ("j1", 1): 110.0, ("j2", 0): 110.0, ("j2", 1): 110.5})
    assert benchsummary.steady_s_per_proof(run, part_done, 2) == 0.5
    assert benchsummary.steady_s_per_proof(run, part_done, 2, floor_s=2.4) == 2.4
    assert benchsummary.steady_s_per_job(run, part_done, 2, floor_s=2.4) == 4.8


def test_steady_figure_of_passes_that_complete_together_is_the_device_rate() -> None:
    """A prover proving 3 partitions a pass, 0.1 s each (0.3 s a pass), the device never idle: 3 jobs of
    3 partitions, one pass each, then the first job; each pass's partitions complete together after it.
    Timed where each partition's device stage ended (its span) the steady figure is the device's 0.1 s;
    timed by completions the window would open on the first job's pass and count its siblings of
    another job as made in no time. The floor, from the partitions counted, is not reported as decided."""
    from cuzk_mp.pipeline.types import PartitionResult, StageSpan

    t0, share = 100.0, 0.1
    # pass 0 holds j0's partitions 0, 1 and j1's 0; pass 1: j0's 2, j1's 1, 2; pass 2: j2's three
    passes = [[("j0", 0), ("j0", 1), ("j1", 0)], [("j0", 2), ("j1", 1), ("j1", 2)], [("j2", 0), ("j2", 1), ("j2", 2)]]
    spans: dict[tuple[str, int], StageSpan] = {}
    part_done: dict[tuple[str, int], float] = {}
    t = t0
    for k, members in enumerate(passes):
        for key in members:
            spans[key] = StageSpan("device", "cuzk-prover-0", t, t + share)
            t += share
        for i, key in enumerate(members):
            part_done[key] = t + 0.01 * (i + 1)  # after the pass, a message each
    run = benchrun.RunResults(t_start=t0)
    run.results = [argparse.Namespace(job_id=j, partitions=[
        PartitionResult(i, {}, [], {"device": share}, 0, 1, spans=[spans[(j, i)]]) for i in range(3)])
        for j in ("j0", "j1", "j2")]
    run.t_done = {j: max(v for (job, _), v in part_done.items() if job == j) for j in ("j0", "j1", "j2")}
    by_completion = benchsummary.steady_s_per_proof(run, part_done, 3)
    assert by_completion < share * 0.9  # j1's 1 and 2 complete just after j0, proved with it
    made = benchsummary.made_at(part_done, [run])
    assert benchsummary.steady_s_per_proof(run, made, 3) == pytest.approx(share)
    later = benchsummary.run_window(run, made)[1]
    assert sorted(later) == [("j1", 1), ("j1", 2), ("j2", 0), ("j2", 1), ("j2", 2)]
    parts = [{"timings": {"device": share}} for _ in later]
    assert benchsummary.capacity_s_per_partition(parts, devices=1, workers=2) == pytest.approx(share)


def test_a_partition_is_made_where_its_device_span_ends() -> None:
    """The engine's spans and the bench's completions share the monotonic clock: a partition was made
    where its device stage's span ended, one with no device span (it failed) when it completed."""
    from cuzk_mp.pipeline.types import PartitionResult, StageSpan

    mono = 500.0
    timings = {"device": 1.0, "finalize": 0.2, "total": 5.0}
    spans = {0: [StageSpan("device", "cuzk-prover-0", mono + 1.0, mono + 2.0)], 1: []}
    run = benchrun.RunResults(t_start=mono, t_done={"j0": mono + 4.0})
    run.results = [argparse.Namespace(job_id="j0", partitions=[
        PartitionResult(i, {}, [], timings, 0, 1, spans=spans[i]) for i in (0, 1)])]
    part_done = {("j0", 0): mono + 2.3, ("j0", 1): mono + 4.0}
    assert benchsummary.made_at(part_done, [run]) == {("j0", 0): mono + 2.0, ("j0", 1): mono + 4.0}


def test_capacity_is_the_slower_stage_over_its_parallelism() -> None:
    """Synthesis's timing already holds the witness (synth.py times both from the witness's start):
    the witness is not added again."""
    parts = [{"timings": {"device": d, "witness": 0.5, "synthesis": s}}
             for d, s in ((1.0, 4.0), (1.2, 5.0), (0.8, 3.0))]
    assert benchsummary.capacity_s_per_partition(parts, devices=1, workers=2) == 2.0  # synthesis: 4.0 / 2 workers
    assert benchsummary.capacity_s_per_partition(parts, devices=1, workers=8) == 1.0  # the device: 1.0 / 1
    assert benchsummary.capacity_s_per_partition(parts, devices=2, workers=8) == 0.5
    assert benchsummary.capacity_s_per_partition([{"timings": {}}], devices=1, workers=1) == 0.0
    # the mean, a bound: a window's partitions took their device seconds of it, one after another
    skewed = [{"timings": {"device": d}} for d in (0.2, 0.2, 0.2, 1.0)]
    assert benchsummary.capacity_s_per_partition(skewed, devices=1, workers=1) == pytest.approx(0.4)


def test_device_busy_is_the_union_of_the_placed_stages() -> None:
    """Steady window 110-120 s. Device 0: stages placed at 109-111 (clipped to 110-111), 111-114
    and 113.5-116 (overlapping the one before by late messages: counted once), so 6 s of 10;
    device 1: a pass of 3 partitions (1 s each as their share) ending at 117 (their finalizes
    queued: 117.1, 117.2), so 114-117.2; a partition without a device (failed) counts nowhere."""
    run = benchrun.RunResults(t_start=100.0, t_done={"j0": 110.0, "j1": 120.0})

    def part(device: int | None, device_s: float, finalize_starts: float, batch: int = 1) -> dict[str, object]:
        return {"device": device, "t_done_mono": finalize_starts + 0.5,
                "timings": {"device": device_s, "finalize": 0.5, "device_batch": float(batch)}}

    parts = [part(0, 2.0, 111.0), part(0, 3.0, 114.0), part(0, 2.5, 116.0),
             part(1, 1.0, 117.0, 3), part(1, 1.0, 117.1, 3), part(1, 1.0, 117.2, 3), part(None, 1.0, 115.0)]
    busy = benchsummary._device_fractions(parts, [run])
    assert busy is not None
    assert busy == {"0": pytest.approx(0.6), "1": pytest.approx(0.32)}


def test_one_job_a_run_leaves_the_cold_job_out_of_the_steady_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """--jobs 1: run 0's one job is the cold one (first_job_s); the steady figures are the later runs'
    lone jobs on the warm engine, and the table says so; with one run there is no steady figure."""
    assert [benchsummary.steady_basis(j, r) for j, r in ((3, 1), (1, 2), (1, 1))] == [
        "window", "lone warm jobs", "cold job only"]
    out = tmp_path / "r.json"
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "2", "--jobs", "1", "--repeat", "3",
                  "--quiet", "--cache", str(KEY_CACHE), "--json", str(out))
    with caplog.at_level(logging.INFO, logger="cuzk_mp"):
        assert args.func(args) == 0
    logged = [r.getMessage() for r in caplog.records]
    # the start step counts the prover processes; a stop with nothing in flight is no drain
    assert any("starting the engine: " in m and ", 1 prover process(es)" in m for m in logged)
    assert any("stopping: no job in flight" in m for m in logged) and not any("draining" in m for m in logged)
    result = json.loads(out.read_text())
    assert result["steady_basis"] == "lone warm jobs"
    assert len(result["s_per_partition_runs"]) == len(result["s_per_job_runs"]) == 2  # runs 1 and 2
    assert "each a lone job on a warm engine" in capsys.readouterr().out


def test_per_partition_figure_of_older_results() -> None:
    """A result written before s_per_partition existed: its s_per_proof is the per-partition figure
    (what the table, the plot title and perf/pipeline_summary.py read)."""
    from cuzk_mp.pipeline.benchreport import s_per_partition

    old = {"s_per_proof": 0.5, "s_per_proof_runs": [0.5, 0.6]}
    assert s_per_partition(old) == (0.5, [0.5, 0.6])
    assert s_per_partition({**old, "s_per_partition": 0.4, "s_per_partition_runs": [0.4]}) == (0.4, [0.4])


def test_device_plan_line(test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU bench's third line: the key's device plan on the first GPU's memory (each worker's
    batch of the small partitions counted); a GPU too small for the key says so with the sizes; an
    unknown GPU memory says that."""
    from cuzk_mp.backends.gpu.msm_params import graph_params_for
    from cuzk_mp.backends.gpu.plan import KeyShape, plan_device
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.pipeline.memory import Machine, batched, circuit_size
    from cuzk_mp.pipeline.types import BATCH_ENV, EngineConfig

    monkeypatch.delenv("CUZK_GPU_MSM_MULTIPLES", raising=False)
    monkeypatch.delenv("CUZK_GPU_MSM_GRAPHS", raising=False)
    monkeypatch.delenv(BATCH_ENV, raising=False)
    h200 = Machine(cores=16, memory_bytes=128 << 30, gpus=(("NVIDIA H200", 139 << 30),))
    size = circuit_size(test_key[0])
    line = benchoptions.device_plan_line(size, h200, [0], 2)
    with read_zkey(test_key[0]) as zkey:  # a small key: its MSMs' CUDA graphs are planned too
        want = plan_device(KeyShape.of(zkey), 139 << 30, workers=2, multiples="auto",
                           graph_params=graph_params_for(zkey.domain_size),
                           batch=batched(size, EngineConfig.prover_batch))
    assert line == f"{want.summary()} (GPU 0, 2 prover worker(s))" and "fits" in line and want.graphs
    assert want.batch == EngineConfig.prover_batch > 1 and "in batches of" in line
    from cuzk_mp.backends.gpu.plan import largest_fitting_domain

    tiny = Machine(cores=16, memory_bytes=128 << 30, gpus=(("small", 514 << 20),))  # the margin and a bit
    small = benchoptions.device_plan_line(size, tiny, [3], 2)
    best = largest_fitting_domain(want.shape, 514 << 20)
    assert best is not None and best < want.shape.domain_size
    assert small.startswith("device plan: GPU 3: the proving key (domain 2^10") and "only 0.50 GiB is free" in small
    assert f"largest domain of this circuit's shape that fits is 2^{best.bit_length() - 1}" in small
    unknown = Machine(cores=16, memory_bytes=128 << 30, gpus=(("?", 0),))
    assert "not known" in benchoptions.device_plan_line(size, unknown, [0], 2)


def test_bench_with_a_key_generated_in_the_provers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--key-source device``: no key file is written (the param cache holds the circuit data and the toxic
    waste alone), each
    of two provers generates the key from the engine's toxic waste, and every proof (made by either)
    verifies against the verification key a prover reported, and in snarkjs (``--proofs-dir``); a tampered
    proof does not; a .zkey circuit refuses the option."""
    cache = tmp_path / "cache"
    out = tmp_path / "bench.json"
    proofs = tmp_path / "proofs"
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "2", "--jobs", "2", "--in-flight", "2",
                  "--partition-workers", "1", "--devices", "0,1", "--ring-slots", "2", "--key-source", "device",
                  "--cache", str(cache), "--json", str(out), "--proofs-dir", str(proofs))
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "generated in the provers" in text and "4 / 4" in text
    assert "wrote verification_key.json and 4 proof(s)" in text
    from tests import oracle

    if oracle.tools_missing() is None:  # snarkjs, the outside check (CI has it: `make test` installs the tools)
        cases = [(json.loads((proofs / f"bench-0-{j}-{i}.public.json").read_text()),
                  json.loads((proofs / f"bench-0-{j}-{i}.proof.json").read_text())) for j in range(2) for i in range(2)]
        bad_public = [str(int(cases[0][0][0]) + 1)] + cases[0][0][1:]
        assert oracle.groth16_verify_many(proofs / "verification_key.json",
                                          [*cases, (bad_public, cases[0][1])]) == [True] * 4 + [False]
    result = json.loads(out.read_text())
    assert result["proofs_total"] == result["proofs_verified"] == 4
    assert result["config"]["key_source"] == "device" and result["key_load_s"] > 0
    assert sorted({p["device"] for p in result["partitions"]}) == [0, 1]  # both provers' keys proved
    files = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
    assert files == [f"porep-like-{LOG_N}.device.synth-abc", f"porep-like-{LOG_N}.device.toxic"]
    zkey_args = _parse("--backend", "cpu", "--circuit", str(tmp_path / "x.zkey"), "--key-source", "device",
                       "--cache", str(cache))
    with pytest.raises(InputError, match="key-source device is for the synthetic circuits"):
        zkey_args.func(zkey_args)


def test_a_generated_keys_vk_outlives_later_reports(tmp_path: Path) -> None:
    """The prover reports a generated key more than once (loaded, preloaded, evicted): the verification
    key of the first report stays, whatever the later ones carry."""
    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.circuits import CircuitTable

    table = CircuitTable(tmp_path, "cpu")
    assert table.vk("c") is None
    table.on_key_state("cuzk-prover-0", msg.KeyState("c", "host", 1, vk=b"{}"))
    table.on_key_state("cuzk-prover-0", msg.KeyState("c", "host", 1))
    assert table.vk("c") == b"{}"
    table.on_key_state("cuzk-prover-0", msg.KeyState("c", None, 0))
    assert table.vk("c") == b"{}"


def test_the_toxic_waste_of_a_generated_key_is_kept_in_the_param_cache(tmp_path: Path) -> None:
    """Drawn once (mode 0600) and read back by every later engine: the same key after a restart; a damaged
    file is replaced by fresh secrets, never used."""
    from cuzk_mp.pipeline.keys import device_toxic_waste

    first = device_toxic_waste("porep-like", 10, tmp_path)
    path = tmp_path / "porep-like-10.device.toxic"
    assert path.stat().st_mode & 0o777 == 0o600
    assert device_toxic_waste("porep-like", 10, tmp_path) == first
    assert device_toxic_waste("porep-like", 12, tmp_path) != first  # each circuit its own
    path.write_text("1 2 three 4\n")
    again = device_toxic_waste("porep-like", 10, tmp_path)
    assert again != first and device_toxic_waste("porep-like", 10, tmp_path) == again


def test_big_circuit_data_is_built_in_a_child_process(tmp_path: Path) -> None:
    """The build that holds a circuit's whole r1cs runs in a spawned child (here forced at 2^10): the file
    it leaves opens with the generator's identity; a damaged file is rebuilt the same way."""
    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data, open_device_circuit_data

    path = ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path, child=True)
    first = open_device_circuit_data(path, "porep-like", LOG_N)
    counts = first.counts
    first.close()
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # a flipped body byte: the body hash no longer matches
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="body hash"):
        open_device_circuit_data(path, "porep-like", LOG_N)
    assert ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path, child=True) == path
    again = open_device_circuit_data(path, "porep-like", LOG_N)
    assert again.counts == counts
    again.close()


@pytest.mark.parametrize(("argv", "message"), [
    (("--jobs", "100000000000"), r"--jobs must be 1\.\.100000, got 100000000000"),
    (("--in-flight", "5000"), r"--in-flight must be 1\.\.1024"),
    (("--partitions", "2000"), r"--partitions must be 1\.\.1024"),
    (("--jobs", "1000", "--partitions", "1000"),
     r"--jobs 1000 x --partitions 1000 x --repeat 1 is 1000000 proofs, more than 100000 .*run the bench several"),
    (("--jobs", "100", "--partitions", "100", "--repeat", "11"), r"is 110000 proofs, more than 100000"),
    (("--start-timeout", "inf"), r"--start-timeout must be a number of seconds in \(0, 86400\], got inf"),
    (("--start-timeout", "nan"), r"--start-timeout must be"),
    (("--wtns", "x.wtns"), r"--wtns and --r1cs are for a \.zkey circuit; porep-like makes its own"),
    (("--circuit", "x.zkey", "--log-n", "10"), r"--log-n is for the synthetic circuits"),
    (("--circuit", "porep"), r"--circuit porep: neither a synthetic kind \(porep-like, dense-random\) nor a \.zkey "
                             r"file \(no such file\)"),
    (("--circuit", "{tmp}"), r"--circuit .*: neither a synthetic kind .* \(not a file\)"),
    (("--circuit", "{tmp}/afile/"), r"--circuit .*afile/: neither a synthetic kind .* \(not a file\)"),
    (("--circuit", "{tmp}/afile", "--r1cs", "{tmp}/afile"), r"--circuit ZKEY needs --wtns"),
    (("--circuit", "{tmp}/afile", "--wtns", "{tmp}/no.wtns", "--r1cs", "{tmp}/afile"),
     r"--wtns .*no\.wtns: no such file"),
    (("--circuit", "{tmp}/afile", "--wtns", "{tmp}/afile", "--r1cs", "{tmp}"), r"--r1cs .*: not a file"),
    (("--synthesis-threads", "100000"), r"--synthesis-threads must be 1\.\.1024, got 100000"),
    (("--gpu-workers", "5000"), r"--gpu-workers must be 1\.\.1024, got 5000"),
    (("--log-n", "0"), r"--log-n must be 10\.\.28 \(the synthetic circuits' sizes\), got 0"),
    (("--circuit", "dense-random", "--log-n", "40"), r"--log-n must be 10\.\.28"),
    (("--json", "{tmp}"), r"--json .*: is a folder"),
    (("--json", "{tmp}/afile/x.json"), r"--json .*: .*afile is not a folder"),
    (("--proofs-dir", "{tmp}/afile"), r"--proofs-dir .*: .*afile is not a folder"),
    # a place no file can be made in, even by root (whom the permission bits let through): tried up front
    (("--proofs-dir", "/proc/x"), r"--proofs-dir /proc/x: /proc is not writable \(a file made there to try it failed"),
    (("--json", "/proc/x.json"), r"--json /proc/x\.json: /proc is not writable"),
    (("--cache", "{tmp}/afile/c"), r"--cache .*: .*afile is not a folder"),
    (("--host-budget", "banana"), r"--host-budget: cannot parse size 'banana'"),
    (("--host-budget", "64 GB RAM"), r"--host-budget: cannot parse size"),
])
def test_bad_options_are_refused_before_any_work(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    (tmp_path / "afile").write_text("")
    args = _parse("--backend", "cpu", *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    with pytest.raises(InputError, match=message):
        benchoptions.fill_defaults(args, "cpu")


def test_a_plot_in_a_format_matplotlib_cannot_write_is_refused_up_front(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the optional matplotlib")
    args = _parse("--backend", "cpu", "--plot", str(tmp_path / "p.txt"))
    with pytest.raises(InputError, match=r"--plot .*p\.txt: matplotlib writes .*\.png.*; not \.txt"):
        benchoptions.fill_defaults(args, "cpu")
    same = tmp_path / "r.json"
    args = _parse("--backend", "cpu", "--plot", str(same), "--json", str(same))
    with pytest.raises(InputError, match="given as both the json and the plot output"):
        benchoptions.fill_defaults(args, "cpu")


def test_a_bench_with_failed_proofs_ends_in_a_line_saying_why(capsys: pytest.CaptureFixture[str]) -> None:
    def part(i: int, error: str | None = None, kind: str | None = None) -> dict[str, object]:
        return {"job": "bench-0-0", "index": i, "error": error, "error_kind": kind}

    ok = {"proofs_total": 2, "proofs_verified": 2, "partitions": [part(0), part(1)]}
    assert bench._verdict(ok) == 0 and capsys.readouterr().err == ""
    unsat = {"proofs_total": 2, "proofs_verified": 0,
             "partitions": [part(0, "witness does not satisfy constraint 7", "UnsatisfiedWitness"),
                            part(1, "witness does not satisfy constraint 7", "UnsatisfiedWitness")]}
    assert bench._verdict(unsat) == 2  # the input's fault, as one-shot groth16 prove answers it
    err = capsys.readouterr().err
    assert "cuzk-mp bench: 2 of 2 proofs missing or invalid; 2 partition(s) not proved, 2 of them failed, the " \
           "first (bench-0-0 partition 0): witness does not satisfy constraint 7" in err
    # the failure cancels its job's other partitions: still the input's fault, and named as the cause
    sibling = {"proofs_total": 3, "proofs_verified": 0,
               "partitions": [part(0, "not proved: job failed (partition 1: ...)", "Cancelled"),
                              part(1, "witness does not satisfy constraint 7", "UnsatisfiedWitness"),
                              part(2, "not proved: job failed (partition 1: ...)", "Cancelled")]}
    assert bench._verdict(sibling) == 2
    assert "3 partition(s) not proved, 1 of them failed, the first (bench-0-0 partition 1): witness does not " \
           "satisfy constraint 7" in capsys.readouterr().err
    for bad in ("a", "0,0", "-1"):
        with pytest.raises(SystemExit):
            _parse("--backend", "cpu", "--devices", bad)
        assert "argument --devices" in capsys.readouterr().err
    with pytest.raises(InputError, match="--ring-slots must be 1..256, got 300"):
        benchoptions.fill_defaults(_parse("--backend", "cpu", "--ring-slots", "300"), "cpu")
    died = {"proofs_total": 2, "proofs_verified": 1,
            "partitions": [part(0), part(1, "cuzk-prover-0 died", "WorkerDied")]}
    assert bench._verdict(died) == 1 and "1 of 2 proofs missing or invalid" in capsys.readouterr().err
    bad_proof = {"proofs_total": 2, "proofs_verified": 1, "partitions": [part(0), part(1)]}
    assert bench._verdict(bad_proof) == 1 and "do not verify" in capsys.readouterr().err


def test_a_zkey_circuit_is_reported_at_its_keys_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cuzk_mp import cli

    assert cli.main(["circuit", "porep-like", "--log-n", "10", str(tmp_path)]) == 0
    key = tmp_path / "k.zkey"
    assert cli.main(["setup", "--backend", "cpu", str(tmp_path / "porep-like-10.r1cs"), str(key)]) == 0
    out = tmp_path / "r.json"
    args = _parse("--backend", "cpu", "--circuit", str(key), "--wtns", str(tmp_path / "porep-like-10.wtns"),
                  "--r1cs", str(tmp_path / "porep-like-10.r1cs"), "--partitions", "2", "--jobs", "1",
                  "--quiet", "--json", str(out))
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["config"]["log_n"] == 10 and result["proofs_verified"] == result["proofs_total"] == 2
    assert "2^10" in capsys.readouterr().out


class _Terminal(io.StringIO):
    """A stderr that is a terminal: the progress bar redraws its line there."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("again", [False, True], ids=["one signal", "a second one during the clean-up"])
def test_an_interrupted_bench_stops_its_engine_without_waiting_for_the_jobs_in_flight(
        monkeypatch: pytest.MonkeyPatch, again: bool) -> None:
    """Ctrl-C: no drain, the ring removed, and the progress bar ends its line and draws no more (the
    partitions the stop cancels are no progress, and the lines that follow start on their own). A
    second signal while the bench cleans up (``timeout`` sends SIGTERM to the bench and again to its
    process group) still leaves the engine stopped, not running on past the bench's exit."""
    import signal

    from cuzk_mp.errors import Terminated
    from cuzk_mp.pipeline.engine import RunningEngine
    from cuzk_mp.pipeline.monitor import MemorySampler

    graces: list[float] = []
    stop = RunningEngine.stop

    def recording_stop(self: RunningEngine, grace_s: float = 30.0) -> None:
        graces.append(grace_s)
        stop(self, grace_s)

    interrupted: list[str] = []
    on_partition = benchrun.BenchRun._on_partition

    def interrupt_on_the_first_partition(self: benchrun.BenchRun, job_id: str, result: object) -> None:
        on_partition(self, job_id, result)  # counted on the progress bar
        if not interrupted:
            interrupted.append(job_id)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while jobs are in flight

    sampler_stop = MemorySampler.stop

    def stop_then_signalled(self: MemorySampler) -> dict[str, object]:
        sampler_stop(self)
        raise Terminated()  # the second signal, landing as the sampler's thread is joined

    if again:
        monkeypatch.setattr(MemorySampler, "stop", stop_then_signalled)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(RunningEngine, "stop", recording_stop)
    monkeypatch.setattr(benchrun.BenchRun, "_on_partition", interrupt_on_the_first_partition)
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "4", "--jobs", "50", "--in-flight", "4",
                  "--partition-workers", "1", "--ring-slots", "2", "--synthesis-threads", "1",
                  "--cache", str(KEY_CACHE))
    with pytest.raises(KeyboardInterrupt):
        args.func(args)
    assert graces == [0]  # no drain: the results of the jobs in flight would be thrown away
    drawn = terminal.getvalue()
    assert "/200 proofs" in drawn and drawn.endswith("\n"), repr(drawn[-300:])
    assert "failed" not in drawn, repr(drawn[-300:])  # the cancelled partitions are not drawn
    assert shm_entries(f"cuzk-bench-{os.getpid()}") == []
    import threading

    assert not [t for t in threading.enumerate() if t.name == "cuzk-mem-sampler"]  # stopped, not left sampling


def test_a_job_that_ends_as_an_interrupted_bench_stops_its_sampler_is_no_callback_error() -> None:
    """Ctrl-C as a job ends: the bench takes its memory sampler away to stop it while the engine's thread
    runs that job's callback, which samples: the callback goes on with the sampler it read (it failed,
    'NoneType' object has no attribute 'peak_pss', an 'engine callback failed' traceback)."""
    from cuzk_mp.pipeline.types import JobResult

    run = benchrun.BenchRun(argparse.Namespace(jobs=2), "cpu", [0])

    class Sampler:
        peak_pss = {"cuzk-prover-0": 123}

        def sample(self) -> None:
            run.sampler = None  # the interrupted bench's stop of it, meanwhile

    run.sampler = Sampler()  # type: ignore[assignment]
    run._on_job(JobResult("bench-0-0", "c", "done", [], None, 0.0, 0.0, 1.0))
    assert run.pss_first_job == {"cuzk-prover-0": 123} and list(run.current.t_done) == ["bench-0-0"]


def test_a_json_result_that_cannot_be_written_is_an_output_error_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full.json"
    full.symlink_to("/dev/full")  # passes the up-front checks, fails on the write: a disk that filled meanwhile
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "1", "--jobs", "1",
                  "--partition-workers", "1", "--ring-slots", "1", "--synthesis-threads", "1", "--quiet",
                  "--cache", str(KEY_CACHE), "--json", str(full))
    assert args.func(args) == 2  # an output refused as a place: the exit code of an OutputError
    err = capsys.readouterr().err
    assert f"--json: {full}: cannot write it: No space left on device" in err and err.count(str(full)) == 1, err


def test_a_shape_that_does_not_fit_points_at_the_benchs_own_options(tmp_path: Path) -> None:
    """The bench reads no config file: its message names its options, not the daemon's sections."""
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partition-workers", "99999", "--cache", str(KEY_CACHE))
    benchoptions.fill_defaults(args, "cpu")
    circuit = benchoptions.bench_circuit(args, "cpu")
    with pytest.raises(InputError) as e:
        benchoptions.choose_shape(args, "cpu", circuit, benchoptions.machine_for("cpu", [0]), [0])
    message = str(e.value)
    assert message.startswith("--host-budget (auto: RAM - 4 GiB): ") and "99999 synthesis worker(s)" in message
    assert message.endswith("raise it, or give the shape with --ring-slots, --partition-workers and "
                            "--synthesis-threads")
    assert "[pipeline]" not in message


def test_a_zkey_circuits_r1cs_or_witness_of_another_circuit_is_refused_before_the_engine_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuzk_mp.circuits.synthetic_kinds import write_synthetic
    from cuzk_mp.pipeline.engine import Engine
    from tests.helpers import synthetic_key

    def no_start(self: Engine) -> None:
        raise AssertionError("the engine started: the mismatch was found only by the partitions")

    monkeypatch.setattr(Engine, "start", no_start)
    zkey, r1cs = synthetic_key()  # porep-like 2^LOG_N
    other_r1cs, other_wtns = write_synthetic("dense-random", LOG_N, tmp_path)  # 1053 wires, the key's 1016
    _, own_wtns = write_synthetic("porep-like", LOG_N, tmp_path)
    for wtns, circuit_r1cs, message in ((other_wtns, r1cs, r"--wtns .*dense-random-10\.wtns: the witness has 1053 "
                                                            r"values; the key .*porep-like-10\.zkey has 1016 wires"),
                                        (own_wtns, other_r1cs, r"dense-random-10\.r1cs does not match .*porep-like-10"
                                                               r"\.zkey: r1cs has 1053 wires")):
        args = _parse("--backend", "cpu", "--circuit", str(zkey), "--wtns", str(wtns), "--r1cs", str(circuit_r1cs),
                      "--partitions", "1", "--jobs", "1", "--quiet")
        with pytest.raises(InputError, match=message):
            args.func(args)


def test_a_result_file_that_would_replace_an_input_is_refused_before_any_work(tmp_path: Path) -> None:
    zkey, r1cs, wtns = (tmp_path / f"c.{ext}" for ext in ("zkey", "r1cs", "wtns"))
    for f in (zkey, r1cs, wtns):
        f.write_bytes(b"input")
    circuit = ("--circuit", str(zkey), "--r1cs", str(r1cs), "--wtns", str(wtns))
    for option, target, name in (("--json", r1cs, "r1cs"), ("--json", zkey, "circuit"), ("--json", wtns, "wtns")):
        args = _parse("--backend", "cpu", *circuit, option, str(target))
        with pytest.raises(InputError, match=rf"c\.\w+: the json output would replace the {name} input"):
            benchoptions.fill_defaults(args, "cpu")
    assert all(f.read_bytes() == b"input" for f in (zkey, r1cs, wtns))


def test_a_damaged_cached_dev_key_is_moved_aside_and_made_again_and_a_given_key_never_touched(
        tmp_path: Path, test_key: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    """A dev key cut short in the param cache (a copy that stopped, a disk that filled) is the cache's to
    remake: moved to <name>.zkey.damaged with a warning, made again, and the bench's circuit sizes read
    from the new one. A .zkey the user passes is theirs: refused with the file named, left as it was."""
    import shutil

    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    zkey, r1cs = test_key
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(zkey, cache / zkey.name)
    shutil.copy(r1cs, cache / r1cs.name)
    cached = cache / zkey.name
    with open(cached, "r+b") as f:
        f.truncate(cached.stat().st_size // 2)
    cut = cached.read_bytes()
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.pipeline.keys"):
        args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--cache", str(cache))
        benchoptions.fill_defaults(args, "cpu")
        assert benchoptions.bench_circuit(args, "cpu").domain_size == 2**LOG_N
    assert (cache / (zkey.name + ".damaged")).read_bytes() == cut
    with read_zkey(cached):
        pass  # whole again
    assert any("cannot be read" in r.getMessage() and ".damaged" in r.getMessage() for r in caplog.records)
    assert ensure_synthetic_key("porep-like", LOG_N, cache, "cpu")[0] == cached  # kept from here

    given = tmp_path / "given.zkey"
    given.write_bytes(cut)
    (tmp_path / "w.wtns").write_bytes(b"")
    args = _parse("--backend", "cpu", "--circuit", str(given), "--wtns", str(tmp_path / "w.wtns"),
                  "--r1cs", str(r1cs))
    benchoptions.fill_defaults(args, "cpu")
    with pytest.raises(InputError, match=r"given\.zkey.*truncated"):
        benchoptions.bench_circuit(args, "cpu")
    assert given.read_bytes() == cut and not (tmp_path / "given.zkey.damaged").exists()


def test_a_failed_output_loses_none_of_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The proofs folder cannot be written (a full disk, an I/O error) after a long run: the JSON
    result is written all the same, and the run ends non-zero naming the output that failed."""
    from cuzk_mp.errors import OutputError

    result = {"proofs_total": 1, "proofs_verified": 1, "partitions": [], "config": {}}

    class Run:
        def __init__(self, *args: object) -> None:
            pass

        def execute(self, circuit: object) -> dict[str, object]:
            return {"vk": None, "runs": []}

    def disk_full(folder: Path, *args: object) -> int:
        raise OutputError(folder / "bench-0-0-0.proof.json", "No space left on device")

    monkeypatch.setattr(bench, "BenchRun", Run)
    monkeypatch.setattr(bench, "summarize", lambda run, raw: dict(result))
    monkeypatch.setattr(bench, "table", lambda r: "the table")
    monkeypatch.setattr(bench, "write_proofs", disk_full)
    monkeypatch.setattr(bench, "choose_shape", lambda *a: "shape")
    out = tmp_path / "r.json"
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--cache", str(KEY_CACHE), "--json", str(out),
                  "--proofs-dir", str(tmp_path / "proofs"))
    assert args.func(args) != 0
    assert json.loads(out.read_text())["proofs_verified"] == 1
    err = capsys.readouterr().err
    assert f"--proofs-dir: {tmp_path / 'proofs'}/" in err and "No space left on device" in err
    assert f"(--json {out} written)" in err and err.count("cannot write it") == 1  # the JSON is not a failure


def test_the_machine_block_names_the_gpus_asked_for_or_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result names its GPUs: the devices a bench used, or (None) every GPU nvidia-smi lists, for a
    script whose processes leave the choice to CUDA; none where nvidia-smi is missing."""
    import subprocess

    from cuzk_mp.pipeline import benchreport

    real = subprocess.run

    def smi(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if cmd[0] != "nvidia-smi":  # platform's own uname, git
            return real(cmd, **kw)  # type: ignore[call-overload, no-any-return]
        return subprocess.CompletedProcess(cmd, 0, stdout="0, NVIDIA H200\n1, NVIDIA H100 80GB HBM3\n")

    monkeypatch.setattr(benchreport.subprocess, "run", smi)
    assert benchreport.gpu_names([1]) == ["1: NVIDIA H100 80GB HBM3"]
    assert benchreport.gpu_names(None) == ["0: NVIDIA H200", "1: NVIDIA H100 80GB HBM3"]
    assert benchreport.machine_info(None)["gpus"] == ["0: NVIDIA H200", "1: NVIDIA H100 80GB HBM3"]
    assert benchreport.machine_info([])["gpus"] == []

    def missing(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if cmd[0] != "nvidia-smi":
            return real(cmd, **kw)  # type: ignore[call-overload, no-any-return]
        raise FileNotFoundError(cmd[0])

    monkeypatch.setattr(benchreport.subprocess, "run", missing)
    assert benchreport.gpu_names(None) == []
