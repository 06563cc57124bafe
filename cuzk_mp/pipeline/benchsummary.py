"""The figures of a bench, from what its runs recorded: steady seconds per partition and per job
(each against the pipeline's capacity), how busy the devices were, the memory bound checked against
the sampled peaks, and the JSON result the table prints (the definitions: :mod:`.bench`).

Arithmetic only, on :class:`~.benchrun.RunResults` and the partitions' timings and spans: no process
is started or waited on here, so each figure can be checked on recorded numbers. Every span a figure
is made of is on the monotonic clock, the bench's completions (:mod:`.benchrun`) and the engine's spans
alike (:mod:`.timeline`); a job's submit time, on the wall clock, is only shown.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

import msgspec

from ..intervals import union_length
from .benchplot import timeline_section
from .benchreport import machine_info, median_stage
from .benchrun import BenchRun, RunResults, verify_all
from .types import STAGES, EngineConfig, prover_batch

if TYPE_CHECKING:
    from .memory import CircuitSize
    from .status import EngineStatus


# A run whose device is busy all through its window times at its capacity, to rounding and the
# window's edges: only a window this much faster than the capacity is reported as floored
FLOOR_TOLERANCE = 0.01
# The bound calibrated on the first job is checked on the whole run's sampled peak; between samples the
# allocator moves a process's footprint by a few hundred KiB, about 1 % of the bound on a small run. A peak
# over the bound by no more than this fraction of it is "within tolerance" (reported as over, never as a
# margin); beyond it the bound is "exceeded". The model's bound gets none: the daemon's budget relies on it.
BOUND_TOLERANCE = 0.01


def run_window(run: RunResults, made: dict[tuple[str, int], float]) -> tuple[float, list[tuple[str, int]]]:
    """(start, partitions made after it) of a run's steady window: it opens where the first job's last
    partition was made. ``made``: when each partition was made (:func:`made_at`)."""
    first = min(run.t_done, key=run.t_done.__getitem__)
    jobs = {j.job_id for j in run.results}
    start = max((t for (job_id, _), t in made.items() if job_id == first), default=run.t_done[first])
    return start, [k for k, t in made.items() if k[0] in jobs and t > start]


def steady_s_per_proof(run: RunResults, made: dict[tuple[str, int], float], partitions: int,
                       floor_s: float = 0.0) -> float:
    """Seconds per proof after the run's first job was made (the cold start excluded), at least
    ``floor_s`` (the pipeline's capacity: :func:`capacity_s_per_partition`).

    window = the last partition made - the first job's last partition made (:func:`run_window`);
    counted are the partitions made inside it. With one job: that job's time / partitions.
    """
    start, later = run_window(run, made)
    if later:
        return max((max(made[k] for k in later) - start) / len(later), floor_s)
    first = min(run.t_done.values())
    return max((first - run.t_start) / partitions, floor_s)


def made_at(part_done: dict[tuple[str, int], float], runs: list[RunResults]) -> dict[tuple[str, int], float]:
    """When each partition was made, on the monotonic clock (``part_done``'s and the spans'): where its
    device stage ended (its span), else when it completed.

    The device stage's end, not the completion: a prover proves small partitions in passes, and the
    partitions of one pass complete together after it, each placed in the timeline at its share of the
    pass (:mod:`.timeline`). Timed by completions, a window that opens on the first job's last pass
    would count that pass's other partitions as made in it in no time (a run of 30 partitions in
    passes of 3 came out ~7 % fast, under the device stage's own time)."""
    made = dict(part_done)
    for run in runs:
        for job in run.results:
            for p in job.partitions:
                ends = [s.end for s in p.spans if s.stage == "device"]
                if ends and (job.job_id, p.index) in made:
                    made[(job.job_id, p.index)] = max(ends)
    return made


def steady_basis(jobs: int, runs: int) -> str:
    """What the steady figures are made of. ``window``: the partitions made after each run's first
    job (:func:`steady_s_per_proof`). With ``--jobs 1`` a run has no partition after its first job:
    ``lone warm jobs``, each later run's one job on an engine warmed by run 0 (one job at a time: a
    lone job's time holds the pipeline's fill and drain, which jobs in flight together overlap), run
    0's cold job being reported apart; or, with one run too, ``cold job only``: no steady figure,
    the figures are the cold job's."""
    if jobs > 1:
        return "window"
    return "lone warm jobs" if runs > 1 else "cold job only"


def steady_s_per_job(run: RunResults, part_done: dict[tuple[str, int], float], partitions: int,
                     floor_s: float = 0.0) -> float:
    """Seconds per whole job at the steady rate: :func:`steady_s_per_proof` times the partitions a
    job has (with one job: that job's time). Counting whole jobs between their completions would
    mislead where jobs run side by side: two finishing together halve that figure."""
    return steady_s_per_proof(run, part_done, partitions, floor_s) * partitions


def capacity_s_per_partition(partitions: list[dict[str, Any]], devices: int, workers: int) -> float:
    """The fewest seconds a partition can take in steady state: its slower stage's mean time over that
    stage's parallelism (the device stage runs one partition a device at a time, its pass share
    counted; synthesis, one a worker: its timing runs from the witness's start, so the witness is
    inside it); 0 where no partition has timings. The mean, not the median: ``partitions`` made in a
    window took their stage's seconds of it, serially on each device (or worker), so the window per
    partition is at least their mean over the parallelism: a bound, where a median above the mean is not."""
    def mean(stage: str) -> float:
        values = [p["timings"][stage] for p in partitions if stage in p["timings"]]
        return statistics.fmean(values) if values else 0.0

    return max(mean("device") / max(devices, 1), mean("synthesis") / max(workers, 1))


def _steady_window(runs: list[RunResults]) -> tuple[float, float]:
    """(start, end) of the steady window of all runs: first job done (run 0) to last job done."""
    return min(runs[0].t_done.values()), max(max(r.t_done.values()) for r in runs)


def _busy_fractions(bench: BenchRun, runs: list[RunResults]) -> dict[str, float] | None:
    """Kernel-busy seconds each prover gained over the steady window, per second of it (GPU only).

    Keyed by prover process name (``cuzk-prover-<dev>``): the per-device figure.
    """
    if bench.backend != "gpu" or len(bench.busy_marks) < 2:
        return None
    first, last = bench.busy_marks[0], bench.busy_marks[-1]
    start, end = _steady_window(runs)
    window = end - start
    if window <= 0:
        return None
    return {p: (last[p] - first.get(p, 0.0)) / window for p in sorted(last)}


def _device_fractions(partitions: list[dict[str, Any]], runs: list[RunResults]) -> dict[str, float] | None:
    """Per device: seconds of the steady window during which one of its partitions was in its
    ``device`` stage (prove_start under the per-device lock), per second of the window. Any
    backend: on the CPU it says whether the prover was kept busy (synthesis kept up); on the GPU it
    sits beside the kernel-busy fraction (the gap is host work under the lock). Keyed by device id.

    Partition timings are durations, so a device stage is placed as ending where finalize began
    (``t_done_mono - finalize``, on the steady window's monotonic clock; message passing makes that
    a little late) and clipped to the window.
    Partitions proved in one pass (``device_batch`` of them) each report their share of it as
    ``device``: each is placed as the whole pass (share x batch), so the pass counts once. The
    stages of one device are serial, but placed that way they can overlap by the messages'
    lateness: the figure is the union of the placed stages, so it never exceeds 1."""
    start, end = _steady_window(runs)
    if end <= start:
        return None
    spans: dict[str, list[tuple[float, float]]] = {}
    for p in partitions:
        if p["device"] is None or p["t_done_mono"] is None:
            continue
        t = p["timings"]
        d_end = p["t_done_mono"] - t.get("finalize", 0.0)  # the device stage ends where finalize begins
        span = t.get("device", 0.0) * t.get("device_batch", 1.0)  # the whole pass it shared
        lo, hi = max(d_end - span, start), min(d_end, end)  # clipped to the window
        if hi > lo:
            spans.setdefault(str(p["device"]), []).append((lo, hi))
    return {dev: union_length(spans[dev]) / (end - start) for dev in sorted(spans)}


def memory_bound(raw: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The memory model's bound, calibrated on the first job, and the model's own prediction,
    both checked against the whole run (one accounting: the monitor's PSS + shm).

    * ring (exact by construction): live shm <= ring_slots x segment_bytes + the
      control block and two semaphores (one page each);
    * host: :func:`~.memory.host_bound` with ``fixed`` = every process's PSS once idle
      with the key loaded, and each kind's working set = the largest growth of one
      process of that kind from idle to its sampled peak when the first job completed
      (``bound_bytes``; ``margin_bytes`` is how far the sampled peak of the whole run
      stayed under it, negative where it went over; ``bound_check`` says which, with
      ``tolerance_bytes`` of allocator noise: :func:`bound_check`), or the model's predicted
      working sets with the circuit data added to ``fixed`` (``model_bound_bytes``,
      ``model_margin_bytes``, ``model_bound_check`` without a tolerance: what the daemon's budget
      and ``--host-budget`` rely on);
    * flat across jobs: ``working_set_excess_bytes`` is the most any synthesis or
      prover process's peak PSS of the whole run went past idle + its kind's
      first-job working set (<= 0: none needed more than in the first job);
      ``peak_host_bytes_by_job`` is the sampled peak between consecutive job completions.
    """
    from .memory import Shape, WorkingSets, host_bound, model_working_sets

    circuit: CircuitSize = raw["circuit"]
    segment = circuit.segment_bytes
    ring_bound = config["ring_slots"] * segment + 3 * 4096
    mem = raw["memory"]
    idle, first, end = mem["idle_pss"], mem["peak_pss_first_job"], mem["peak_pss_by_process"]

    def kind(name: str) -> str:
        return name.rsplit("-", 1)[0] if name.startswith(("cuzk-synth", "cuzk-prover")) else name

    ws: dict[str, int] = {}
    for name, peak in first.items():
        ws[kind(name)] = max(ws.get(kind(name), 0), peak - idle.get(name, 0))
    calibrated = WorkingSets(synth=ws.get("cuzk-synth", 0), prover=ws.get("cuzk-prover", 0),
                             engine=ws.get("engine", 0))
    shape = Shape(config["ring_slots"], config["partition_workers"], config["synthesis_threads"])
    provers, fixed = len(config["devices"]), sum(idle.values())
    bound = host_bound(shape, circuit, provers, calibrated, fixed=fixed)
    # the model's fixed part as the daemon budgets it (:func:`~.memory.fixed_bytes`): the measured idle PSS
    # plus the circuit data, which no process has touched while idle (synthesis maps it on its first task)
    ws_model = model_working_sets(circuit, config["backend"], config["gpu_workers"],
                                  prover_batch(EngineConfig.prover_batch), config["ring_slots"])
    model = host_bound(shape, circuit, provers, ws_model, fixed=fixed + circuit.data_bytes)
    workers = [n for n in end if kind(n) in ("cuzk-synth", "cuzk-prover")]
    excess = max((end[n] - idle.get(n, 0) - ws.get(kind(n), 0) for n in workers), default=0)
    peak_host, peak_shm = mem["peak_host_bytes"], mem["peak_shm_bytes"]
    tolerance = int(BOUND_TOLERANCE * bound.total)
    return {"formula": "fixed + engine_ws + ring_slots*segment_bytes + partition_workers*synth_ws"
                       " + provers*prover_ws (PSS; working sets from the first job, or the model's)",
            "segment_bytes": segment, "fixed_bytes": fixed, "engine_working_set_bytes": calibrated.engine,
            "synth_working_set_bytes": calibrated.synth, "prover_working_set_bytes": calibrated.prover,
            "bound_bytes": bound.total, "bound_parts": bound.as_dict(), "peak_host_bytes": peak_host,
            "margin_bytes": bound.total - peak_host, "tolerance_bytes": tolerance,
            "bound_check": bound_check(bound.total, peak_host, tolerance), "model_bound_bytes": model.total,
            "model_bound_parts": model.as_dict(), "model_margin_bytes": model.total - peak_host,
            "model_bound_check": bound_check(model.total, peak_host),
            "working_set_excess_bytes": excess,
            "peak_host_bytes_by_job": _peaks_by_job(mem["timeline"], raw["runs"]),
            "ring_bound_bytes": ring_bound, "peak_shm_bytes": peak_shm, "ring_margin_bytes": ring_bound - peak_shm,
            "idle_pss_by_process": idle, "peak_pss_first_job_by_process": first, "peak_pss_by_process": end,
            "peak_uss_by_process": mem["peak_uss_by_process"], "peak_anon_by_process": mem["peak_anon_by_process"],
            "idle_uss_by_process": mem["idle_uss"], "idle_anon_by_process": mem["idle_anon"]}


def bound_check(bound_bytes: int, peak_bytes: int, tolerance_bytes: int = 0) -> str:
    """How a sampled peak stands against a bound, in words the JSON and the table share: "held" (at or
    under it), "within tolerance" (over it by at most ``tolerance_bytes``: noise, not a bound that
    failed, but not a margin either), "exceeded"."""
    if peak_bytes <= bound_bytes:
        return "held"
    return "within tolerance" if peak_bytes - bound_bytes <= tolerance_bytes else "exceeded"


def _peaks_by_job(timeline: list[tuple[float, int]], runs: list[RunResults]) -> list[int | None]:
    """The sampled peak host bytes in each window between consecutive job completions (all runs)."""
    ends = sorted(t for run in runs for t in run.t_done.values())
    out: list[int | None] = []
    start = runs[0].t_start if runs else 0.0
    for end in ends:
        inside = [b for t, b in timeline if start < t <= end]
        out.append(max(inside) if inside else None)
        start = end
    return out


def summarize(bench: BenchRun, raw: dict[str, Any]) -> dict[str, Any]:
    """The JSON result (also what the table prints)."""
    a = bench.args
    runs: list[RunResults] = raw["runs"]
    status: EngineStatus = raw["status"]
    devices = status.devices
    partitions: list[dict[str, Any]] = []
    for r, run in enumerate(runs):
        for job in sorted(run.results, key=lambda j: j.job_id):
            for p in job.partitions:
                partitions.append({"run": r, "job": job.job_id, "index": p.index, "device": p.device,
                                   "attempts": p.attempts, "timings": p.timings, "error": p.error,
                                   "error_kind": p.error_kind,
                                   # the job's submit (wall clock: shown); the completion and the
                                   # spans are on the monotonic clock, as the timeline's t0
                                   "t_submit": job.submitted_at,
                                   "t_done_mono": bench.part_done.get((job.job_id, p.index)),
                                   "spans": [dataclasses.asdict(s) for s in p.spans]})
    made = made_at(bench.part_done, runs)
    # each run against the capacity of its own steady partitions: not of the cold first job's (slower,
    # one a pass), nor another run's (slowed or sped by the machine's other work)
    floors = []
    for r, run in enumerate(runs):
        later = set(run_window(run, made)[1])
        mine = [p for p in partitions if p["run"] == r and (not later or (p["job"], p["index"]) in later)]
        floors.append(capacity_s_per_partition(mine, len(devices), a.partition_workers or 1))
    basis = steady_basis(a.jobs, len(runs))
    if basis == "lone warm jobs":  # run 0's one job is the cold one, reported apart (first_job_s)
        runs_steady, floors = runs[1:], floors[1:]
    else:
        runs_steady = runs
    unfloored = [steady_s_per_proof(run, made, a.partitions) for run in runs_steady]
    per_run = [steady_s_per_proof(run, made, a.partitions, floor) for run, floor in zip(runs_steady, floors)]
    per_job = [steady_s_per_job(run, made, a.partitions, floor) for run, floor in zip(runs_steady, floors)]
    total, verified = verify_all(raw["vk"], runs)
    device_peaks = [v.device_peak_bytes for v in status.memory.device.values()]
    busy = _busy_fractions(bench, runs)
    config = {"circuit": a.circuit, "log_n": a.log_n, "partitions": a.partitions, "jobs": a.jobs,
              "in_flight": a.in_flight, "partition_workers": a.partition_workers, "gpu_workers": a.gpu_workers,
              "synthesis_threads": a.synthesis_threads, "ring_slots": a.ring_slots, "host_budget": a.host_budget,
              "devices": devices, "backend": bench.backend, "repeat": a.repeat, "key_source": a.key_source}
    bound = memory_bound(raw, config)
    result = {
        "config": config,
        "s_per_partition": statistics.median(per_run), "s_per_partition_runs": per_run,
        "s_per_job": statistics.median(per_job), "s_per_job_runs": per_job,
        "s_per_partition_floor": statistics.median(floors), "s_per_partition_floor_runs": floors,
        "s_per_partition_floored": any(u < f * (1 - FLOOR_TOLERANCE) for u, f in zip(unfloored, floors)),
        "steady_basis": basis,
        # former names of s_per_partition(_runs), kept for readers of older result files
        "s_per_proof": statistics.median(per_run), "s_per_proof_runs": per_run,
        "first_job_s": min(runs[0].t_done.values()) - runs[0].t_start,
        "key_load_s": raw.get("key_load_s"),
        "proofs_total": total, "proofs_verified": verified,
        "peak_host_bytes": raw["memory"]["peak_host_bytes"], "peak_pss_bytes": raw["memory"]["peak_pss_bytes"],
        "peak_rss_bytes": raw["memory"]["peak_rss_bytes"], "peak_shm_bytes": raw["memory"]["peak_shm_bytes"],
        "peak_uss_by_process": raw["memory"]["peak_uss_by_process"],
        # exact, from the ring's control block (the sampler can miss short-lived segments)
        "peak_live_segments": max(raw["memory"]["peak_live_segments"], status.ring.stats.peak_live),
        "peak_device_bytes": max((d for d in device_peaks if d is not None), default=None),
        # what each prover holds (busy seconds; on the GPU: its keys on the device and on the host)
        "prover_stats": {name: msgspec.to_builtins(v) for name, v in status.memory.device.items()},
        "gpu_busy_fraction": (sum(busy.values()) / len(devices)) if busy else None,
        "gpu_busy_fraction_by_device": busy,
        "device_busy_fraction_by_device": _device_fractions(partitions, runs),
        "median_stage_s": {s: median_stage(partitions, s) for s in STAGES if median_stage(partitions, s) is not None},
        # the device stage as the backend splits it (GPU: each MSM's, the H step's CUDA-event spans)
        "median_device_split_s": {k.removeprefix("gpu_"): median_stage(partitions, k)
                                  for k in sorted({k for p in partitions for k in p["timings"]
                                                   if k.startswith("gpu_")})},
        "partitions_by_device": {str(d): sum(1 for p in partitions if p["device"] == d) for d in devices},
        "memory_bound": bound,
        "synthesis_core_s": _synthesis_core_seconds(partitions, a.synthesis_threads),
        "ring": msgspec.to_builtins(status.ring.stats),
        "machine": machine_info(devices if bench.backend == "gpu" else []),
        "partitions": partitions,
        "timeline": timeline_section(partitions, raw["memory"]["timeline_detail"], {
            "bound_bytes": bound["bound_bytes"], "model_bound_bytes": bound["model_bound_bytes"],
            "host_budget_bytes": _host_budget(a.host_budget)}, runs[0].t_start),
    }
    return result


def _host_budget(text: str | None) -> int | None:
    """``--host-budget`` in bytes (None when not given)."""
    from .memory import host_budget_bytes

    return host_budget_bytes(text, "--host-budget") if text else None


def _synthesis_core_seconds(partitions: list[dict[str, Any]], threads: int) -> float | None:
    """Median core-seconds of one partition's synthesis: the worker's CPU time over it (every thread),
    or, where a worker did not report it, its wall time x the threads it may use (an upper bound)."""
    measured = median_stage(partitions, "synthesis_cpu")
    if measured is not None:
        return measured
    stage = median_stage(partitions, "synthesis")
    return None if stage is None else stage * threads
