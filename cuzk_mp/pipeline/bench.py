"""``cuzk-mp bench``: jobs through the real pipeline, one table, the same as JSON (docs/architecture.md).

Owns one engine for the duration of the run (prefix ``cuzk-bench-<pid>``) and
the measurement around it:

* the first (cold) job is reported apart: ``first_job_s`` runs from the first
  submit to that job's completion (key already resident: ``preload`` runs
  before the clock starts, so "cold" means cold pipeline, warm key);
* steady state per partition: ``s_per_partition = (t_last_partition_made -
  t_first_job_made) / (partitions made after t_first_job_made)`` per run, a partition being made
  where its device stage ended (:func:`made_at`: a pass's partitions complete together after it)
  (with ``--jobs 1``: that job's time / partitions, from the runs after run 0, whose one job is
  the cold one; ``steady_basis`` says which, :func:`steady_basis`), but never below the run's pipeline capacity
  (``s_per_partition_floor(_runs)``, :func:`capacity_s_per_partition`: the slower of the device
  stage's mean over the devices and synthesis's over the workers, over the partitions counted).
  A window's edges can cut a partition's device stage;
  ``s_per_partition_floored`` says where the floor decided. ``s_per_proof`` is the same figure
  under its former name, kept in the JSON so older readers keep working;
* steady state per whole job (all its partitions: a 10-partition PoRep proof is one job):
  ``s_per_job = s_per_partition x partitions`` per run (with ``--jobs 1``: that job's time);
  ``--repeat R`` repeats the batch of jobs R times in the same engine and
  reports the median and min-max. Across processes: run ``cuzk-mp bench
  --json`` several times (perf/pipeline_bench.sh does) and compare the files;
* every proof is verified again at the end, in this process, against the
  zkey's verification key (independently of the provers' self-check); with
  ``--key-source device`` (a synthetic circuit's INSECURE dev key generated in the provers,
  no key file) against the verification key the provers report, and ``key_load_s`` says
  how long loading or generating the key took;
* host memory is sampled every ``SAMPLE_INTERVAL_S`` with the monitor's accounting
  (PSS of the process tree, shared pages once, plus the ring's shm), with each
  process's PSS, USS and anonymous memory beside it; and at every job's end.

The first two lines say which backend runs and why, which devices, cores and host
memory (:func:`machine_line`), then the pipeline's shape and why: the flags given,
the rest derived from the machine and the partition size by the memory and
throughput model within ``--host-budget`` (default: RAM - 4 GiB;
:func:`~.memory.explain_shape`); on the GPU backend a third line gives the key's
device-memory plan (:func:`device_plan_line`).

Memory bound reported (``memory_bound``, see :func:`memory_bound`): the ring's
exact bound on live shm, and the memory model's formula (:func:`~.memory.host_bound`)
with two sets of working sets: calibrated on the first job (``bound_bytes``) and
predicted by the model alone (``model_bound_bytes``), both checked against the
sampled peak of the whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..circuits.synthetic_kinds import MAX_LOG_N, MIN_LOG_N, SYNTHETIC_KINDS
import msgspec

from ..errors import CuzkError, InputError
from ..exit_codes import EXIT_INPUT
from ..intervals import union_length
from ..logs import final_error
from ..paths import default_cache_dir
from .benchplot import plot_timeline, timeline_section
from .benchreport import Progress, machine_info, median_stage, require_matplotlib, step, table
from .types import (
    KEY_SOURCES, MAX_PARTITIONS, MAX_RING_SLOTS, MAX_THREADS, STAGES, CircuitSpec, EngineConfig, JobResult, JobSpec,
    PartitionInput, PartitionResult, field_key, prover_batch,
)

if TYPE_CHECKING:  # imported when a bench runs: `cuzk-mp --help` and the other verbs build this
    # parser without loading the pipeline (numba, posix_ipc, psutil)
    from ..formats.snarkjs_json import VerificationKey
    from .engine import RunningEngine
    from .memory import CircuitSize, Machine
    from .monitor import MemorySampler
    from .status import EngineStatus

# smaps_rollup walks a process's mappings (4 ms for a CPU prover holding a 2^16 key): sampling the tree
# more often takes CPU time the provers of a small machine need
SAMPLE_INTERVAL_S = 0.5
# defaults that finish in well under 5 minutes on the 2-core CPU machine / use an H200 sensibly
# (the shape, ring slots x workers x threads, is derived from the machine: see :func:`_shape`)
DEFAULTS = {
    "cpu": {"log_n": 14, "partitions": 10, "jobs": 3, "in_flight": 2, "gpu_workers": 2},
    "gpu": {"log_n": 20, "partitions": 10, "jobs": 4, "in_flight": 2, "gpu_workers": 2},
}


def device_ids(text: str) -> list[int]:
    """``--devices``: distinct device ids >= 0, comma-separated (argparse's error names the option)."""
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated device ids (integers), e.g. 0,1") from None
    if min(ids) < 0 or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: distinct device ids >= 0")
    return ids


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand and its flags."""
    p = subparsers.add_parser("bench", help="measure throughput and memory of the pipeline (one table, JSON)")
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"],
                   help="auto: the GPU where CuPy sees one, else the CPU")
    p.add_argument("--circuit", default="porep-like",
                   help="'porep-like' or 'dense-random' (synthetic) or a .zkey path (with --wtns, --r1cs)")
    p.add_argument("--wtns", type=Path, help="witness used for every partition of a zkey circuit")
    p.add_argument("--r1cs", type=Path, help="r1cs of a zkey circuit (the witness check)")
    p.add_argument("--log-n", type=int, help="synthetic circuit size, log2 rows (cpu 14, gpu 20)")
    p.add_argument("--key-source", choices=KEY_SOURCES, default="file",
                   help="a synthetic circuit's INSECURE dev key: 'file' (made once in the param cache) or 'device' "
                        "(generated in each prover from the circuit data, no key file: sizes whose keys do not fit "
                        "the disk)")
    p.add_argument("--partitions", type=int, help="partitions per job (10)")
    p.add_argument("--jobs", type=int, help="jobs per run (cpu 3, gpu 4)")
    p.add_argument("--in-flight", type=int, help="jobs submitted at once (2)")
    p.add_argument("--partition-workers", type=int,
                   help="synthesis worker processes (derived from the machine and the partition size)")
    p.add_argument("--gpu-workers", type=int, help="worker threads per prover process (2)")
    p.add_argument("--ring-slots", type=int, help="ring slots (derived from the machine and the partition size)")
    p.add_argument("--synthesis-threads", type=int,
                   help="cores one partition's synthesis uses (derived: the cores the provers leave / workers)")
    p.add_argument("--host-budget", help="host memory the pipeline may use, e.g. 96GiB (default 'auto': RAM - 4 GiB): "
                                         "ring slots, partition workers and threads not given are derived within it, a "
                                         "shape given whole is checked against it")
    p.add_argument("--devices", type=device_ids,
                   help="comma-separated device ids (cpu: one prover process each); default all / one")
    p.add_argument("--repeat", type=int, default=1, help="runs of --jobs jobs in the same engine (default 1)")
    p.add_argument("--json", type=Path, help="write the result as JSON")
    p.add_argument("--proofs-dir", type=Path,
                   help="also write verification_key.json and every proof as JOB-PARTITION.{proof,public}.json "
                        "(snarkjs files: `snarkjs groth16 verify` checks them)")
    p.add_argument("--plot", type=Path, help="write a timeline plot (needs matplotlib)")
    p.add_argument("--cache", type=Path, default=default_cache_dir(),
                   help="param cache for synthetic dev keys (default $CUZK_MP_CACHE, else $XDG_CACHE_HOME/cuzk-mp, "
                        "else ~/.cache/cuzk-mp)")
    p.add_argument("--start-timeout", type=float, default=900.0,
                   help="seconds for the processes to start (a cold GPU machine compiles its kernels first; "
                        "default 900)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run, default_log_level="INFO")  # the engine's start-up steps show while it starts


@dataclass
class _Run:
    """The jobs of one run and when each finished."""

    t_start: float
    results: list[JobResult] = field(default_factory=list)
    t_done: dict[str, float] = field(default_factory=dict)


class BenchRun:
    """One bench invocation: engine up, key resident, runs of jobs, engine down."""

    def __init__(self, args: argparse.Namespace, backend: str, devices: list[int]) -> None:
        self.args = args
        self.backend = backend
        self.devices = devices  # what the engine will use (:func:`_provers`): the start step counts them
        self.cond = threading.Condition()
        self.current = _Run(time.time())
        self.part_done: dict[tuple[str, int], float] = {}
        self.busy_marks: list[dict[str, float]] = []  # busy seconds per prover at run 0's first job, run ends
        self.progress: Progress | None = None
        self.running: RunningEngine | None = None
        self.sampler: MemorySampler | None = None
        self.pss_first_job: dict[str, int] | None = None  # per-process peak PSS when run 0's first job ended

    def _on_partition(self, job_id: str, result: PartitionResult) -> None:
        self.part_done[(job_id, result.index)] = time.time()
        if self.progress is not None:
            self.progress.advance(result.proof is not None)

    def _on_job(self, result: JobResult) -> None:
        with self.cond:
            run = self.current
            run.results.append(result)
            run.t_done[result.job_id] = time.time()
            if self.sampler is not None:
                self.sampler.sample()  # every job window gets at least the sample at its end
                if self.pss_first_job is None:
                    self.pss_first_job = dict(self.sampler.peak_pss)
            if self.running is not None and (len(run.t_done) == 1 or len(run.t_done) == self.args.jobs):
                provers = self.running.metrics().provers
                self.busy_marks.append({name: p.busy_seconds for name, p in provers.items()})
            self.cond.notify_all()

    def spec(self) -> tuple[CircuitSpec, list[PartitionInput]]:
        """The circuit and one job's partition inputs (synthetic seeds vary per job, see :meth:`inputs`)."""
        a = self.args
        if a.circuit in SYNTHETIC_KINDS:
            return CircuitSpec(a.circuit, synthetic=a.circuit, log_n=a.log_n, key_source=a.key_source), []
        spec = CircuitSpec(Path(a.circuit).stem, zkey=Path(a.circuit), r1cs=a.r1cs)
        wtns = a.wtns.read_bytes()
        check_zkey_inputs(Path(a.circuit), a.r1cs, a.wtns, wtns)
        return spec, [PartitionInput("wtns", wtns)] * a.partitions

    def inputs(self, fixed: list[PartitionInput], run: int, job: int) -> list[PartitionInput]:
        """Partition inputs of job ``job`` of run ``run``."""
        if fixed:
            return fixed
        return [PartitionInput("synthetic", seed=1000 * run + job) for _ in range(self.args.partitions)]

    def one_run(self, engine: RunningEngine, circuit_id: str, fixed: list[PartitionInput], run: int) -> _Run:
        """Submit ``jobs`` jobs, at most ``in_flight`` at a time; wait for all."""
        a = self.args
        current = _Run(time.time())
        with self.cond:
            self.current = current
        for j in range(a.jobs):
            with self.cond:
                self.cond.wait_for(lambda: j - len(current.t_done) < a.in_flight)
            engine.submit(JobSpec(f"bench-{run}-{j}", circuit_id, self.inputs(fixed, run, j)))
        with self.cond:
            self.cond.wait_for(lambda: len(current.t_done) == a.jobs)
        return current

    def execute(self, circuit: CircuitSize) -> dict[str, Any]:
        """Run everything; returns the raw measurements (see :func:`summarize`)."""
        from .engine import Engine
        from .monitor import MemorySampler

        a = self.args
        config = EngineConfig(backend=self.backend, devices=a.devices, gpu_workers_per_device=a.gpu_workers,
                              partition_workers=a.partition_workers, synthesis_threads=a.synthesis_threads,
                              ring_slots=a.ring_slots, shm_prefix=f"cuzk-bench-{os.getpid()}", param_cache=a.cache,
                              start_timeout_s=a.start_timeout)
        spec, fixed = self.spec()
        engine = Engine(config, on_job_done=self._on_job, on_partition_done=self._on_partition, key=engine_option)
        # the key first (a synthetic dev key may need a setup, which compiles the fixed-base kernels into
        # CuPy's disk cache before the prover processes warm up), then the processes
        try:
            engine.register_circuit(spec)
        except BaseException:
            engine.stop()
            raise
        with step(f"starting the engine: {a.partition_workers} synthesis worker(s), {len(self.devices)} prover "
                  f"process(es) "
                  f"(a first start on a machine compiles the kernels; limit {a.start_timeout:g} s)"):
            running = self.running = engine.start()
        try:
            ref = running.circuits.ref(spec.circuit_id)
            if ref.key_source == "device":
                what = (f"generating the INSECURE dev key of {ref.synthetic} 2^{ref.log_n} in the provers "
                        "(no key file)")
            else:
                zkey = Path(ref.zkey)
                what = f"loading the proving key {zkey.name} ({zkey.stat().st_size / 2**20:.1f} MiB) into the provers"
            t_key = time.perf_counter()
            with step(what):
                running.preload(spec.circuit_id)
            key_load_s = time.perf_counter() - t_key
            vk = running.circuits.vk(spec.circuit_id)
            sampler = self.sampler = MemorySampler(running.prefix, interval_s=SAMPLE_INTERVAL_S)
            idle = sampler.sample()  # every process idle, the key loaded
            sampler.start()
            self.progress = None if a.quiet else Progress(a.jobs * a.partitions * a.repeat)
            runs = [self.one_run(running, spec.circuit_id, fixed, r) for r in range(a.repeat)]
            memory = sampler.stop()
            self.sampler = None
            memory.update(idle_pss={m.name: m.pss for m in idle}, idle_uss={m.name: m.uss for m in idle},
                          idle_anon={m.name: m.anon for m in idle}, peak_pss_first_job=self.pss_first_job or {})
            status = running.status()
        except BaseException:
            # Ctrl-C or a failure: nothing will read the jobs in flight, so they are not waited for
            # (a drain would keep an interrupted bench for up to its grace, 30 s); the memory sampler,
            # which reads the engine's processes, stops first
            if self.sampler is not None:
                with contextlib.suppress(Exception):
                    self.sampler.stop()
                self.sampler = None
            running.stop(grace_s=0)
            raise
        running.stop()
        return {"spec": spec, "runs": runs, "memory": memory, "status": status, "circuit": circuit,
                "vk": bench_vk(Path(ref.zkey) if ref.key_source == "file" else None, vk), "key_load_s": key_load_s}


def check_zkey_inputs(zkey_path: Path, r1cs_path: Path, wtns_path: Path, wtns: bytes) -> None:
    """InputError where the r1cs or the witness of a .zkey circuit is not of its key, as far as their
    headers tell: found here, before the engine starts and loads the key (minutes for a big one),
    not by every partition after it."""
    from ..formats.r1cs import read_r1cs_header
    from ..formats.wtns import read_wtns
    from ..formats.zkey import read_zkey
    from ..groth16.circuit_data import check_header_match

    with read_zkey(zkey_path, check_coefs=False) as zkey:
        h = read_r1cs_header(r1cs_path)
        check_header_match(str(r1cs_path), h["n_wires"], h["n_pub_out"] + h["n_pub_in"], h["n_constraints"], zkey)
        n = len(read_wtns(wtns, name=str(wtns_path)))
        if n != zkey.n_vars:
            raise InputError(f"--wtns {wtns_path}: the witness has {n} values; the key {zkey_path} has "
                             f"{zkey.n_vars} wires")


def bench_vk(zkey_path: Path | None, vk_json: bytes | None) -> VerificationKey:
    """The benched key's verification key: from its zkey, or for a key with no file the snarkjs
    ``vk_json`` the provers reported."""
    from ..formats.snarkjs_json import vk_from_json
    from ..formats.zkey import read_zkey
    from ..groth16.keys import vk_from_zkey

    if zkey_path is not None:
        with read_zkey(zkey_path) as zkey:
            return vk_from_zkey(zkey)
    if vk_json is None:
        raise CuzkError("no verification key: the provers reported none for the generated key")
    return vk_from_json(json.loads(vk_json))


def write_proofs(folder: Path, vk: VerificationKey, runs: list[_Run]) -> int:
    """verification_key.json and each proof's snarkjs files into ``folder``; the proofs written."""
    from ..formats.snarkjs_json import public_to_json, vk_to_json, write_json

    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "verification_key.json", vk_to_json(vk))
    written = 0
    for run in runs:
        for job in run.results:
            for p in job.partitions:
                if p.proof is not None:
                    write_json(folder / f"{job.job_id}-{p.index}.proof.json", p.proof)
                    write_json(folder / f"{job.job_id}-{p.index}.public.json", public_to_json(p.public))
                    written += 1
    return written


def verify_all(vk: VerificationKey, runs: list[_Run]) -> tuple[int, int]:
    """(proofs total, proofs that pass verification against ``vk``)."""
    from ..formats.snarkjs_json import proof_from_json
    from ..groth16.keys import prepare_vk
    from ..groth16.verifier import verify

    pvk = prepare_vk(vk)
    total = ok = 0
    for run in runs:
        for job in run.results:
            for p in job.partitions:
                total += 1
                ok += int(p.proof is not None and verify(pvk, p.public, proof_from_json(p.proof)))
    return total, ok


# A run whose device is busy all through its window times at its capacity, to rounding and the
# window's edges: only a window this much faster than the capacity is reported as floored
FLOOR_TOLERANCE = 0.01


def run_window(run: _Run, made: dict[tuple[str, int], float]) -> tuple[float, list[tuple[str, int]]]:
    """(start, partitions made after it) of a run's steady window: it opens where the first job's last
    partition was made. ``made``: when each partition was made (:func:`made_at`)."""
    first = min(run.t_done, key=run.t_done.__getitem__)
    jobs = {j.job_id for j in run.results}
    start = max((t for (job_id, _), t in made.items() if job_id == first), default=run.t_done[first])
    return start, [k for k, t in made.items() if k[0] in jobs and t > start]


def steady_s_per_proof(run: _Run, made: dict[tuple[str, int], float], partitions: int,
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


def made_at(part_done: dict[tuple[str, int], float], runs: list[_Run]) -> dict[tuple[str, int], float]:
    """When each partition was made: where its device stage ended (its span), else when it completed.

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
                if ends:
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


def steady_s_per_job(run: _Run, part_done: dict[tuple[str, int], float], partitions: int,
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


def _steady_window(runs: list[_Run]) -> tuple[float, float]:
    """(start, end) of the steady window of all runs: first job done (run 0) to last job done."""
    return min(runs[0].t_done.values()), max(max(r.t_done.values()) for r in runs)


def _busy_fractions(bench: BenchRun, runs: list[_Run]) -> dict[str, float] | None:
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


def _device_fractions(partitions: list[dict[str, Any]], runs: list[_Run]) -> dict[str, float] | None:
    """Per device: seconds of the steady window during which one of its partitions was in its
    ``device`` stage (prove_start under the per-device lock), per second of the window. Any
    backend: on the CPU it says whether the prover was kept busy (synthesis kept up); on the GPU it
    sits beside the kernel-busy fraction (the gap is host work under the lock). Keyed by device id.

    Partition timings are durations, so a device stage is placed as ending where finalize began
    (``t_done - finalize``; message passing makes that a little late) and clipped to the window.
    Partitions proved in one pass (``device_batch`` of them) each report their share of it as
    ``device``: each is placed as the whole pass (share x batch), so the pass counts once. The
    stages of one device are serial, but placed that way they can overlap by the messages'
    lateness: the figure is the union of the placed stages, so it never exceeds 1."""
    start, end = _steady_window(runs)
    if end <= start:
        return None
    spans: dict[str, list[tuple[float, float]]] = {}
    for p in partitions:
        if p["device"] is None or p["t_done"] is None:
            continue
        t = p["timings"]
        d_end = p["t_done"] - t.get("finalize", 0.0)  # the device stage ends where finalize begins
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
      stayed under it), or the model's predicted working sets with the circuit data added to
      ``fixed`` (``model_bound_bytes``,
      ``model_margin_bytes``: what the daemon's budget and ``--host-budget`` rely on);
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
    return {"formula": "fixed + engine_ws + ring_slots*segment_bytes + partition_workers*synth_ws"
                       " + provers*prover_ws (PSS; working sets from the first job, or the model's)",
            "segment_bytes": segment, "fixed_bytes": fixed, "engine_working_set_bytes": calibrated.engine,
            "synth_working_set_bytes": calibrated.synth, "prover_working_set_bytes": calibrated.prover,
            "bound_bytes": bound.total, "bound_parts": bound.as_dict(), "peak_host_bytes": peak_host,
            "margin_bytes": bound.total - peak_host, "model_bound_bytes": model.total,
            "model_bound_parts": model.as_dict(), "model_margin_bytes": model.total - peak_host,
            "working_set_excess_bytes": excess,
            "peak_host_bytes_by_job": _peaks_by_job(mem["timeline"], raw["runs"]),
            "ring_bound_bytes": ring_bound, "peak_shm_bytes": peak_shm, "ring_margin_bytes": ring_bound - peak_shm,
            "idle_pss_by_process": idle, "peak_pss_first_job_by_process": first, "peak_pss_by_process": end,
            "peak_uss_by_process": mem["peak_uss_by_process"], "peak_anon_by_process": mem["peak_anon_by_process"],
            "idle_uss_by_process": mem["idle_uss"], "idle_anon_by_process": mem["idle_anon"]}


def _peaks_by_job(timeline: list[tuple[float, int]], runs: list[_Run]) -> list[int | None]:
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
    runs: list[_Run] = raw["runs"]
    status: EngineStatus = raw["status"]
    devices = status.devices
    partitions: list[dict[str, Any]] = []
    for r, run in enumerate(runs):
        for job in sorted(run.results, key=lambda j: j.job_id):
            for p in job.partitions:
                partitions.append({"run": r, "job": job.job_id, "index": p.index, "device": p.device,
                                   "attempts": p.attempts, "timings": p.timings, "error": p.error,
                                   "error_kind": p.error_kind,
                                   "t_submit": job.submitted_at, "t_done": bench.part_done.get((job.job_id, p.index)),
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
            "host_budget_bytes": _host_budget(a.host_budget)}),
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


SHAPE_KEYS = ("ring_slots", "partition_workers", "synthesis_threads")
# The option of this command that sets each EngineConfig field it sets: the engine's messages name it
# (the daemon's messages name its config file's keys instead).
ENGINE_OPTIONS = {"backend": "--backend", "devices": "--devices", "gpu_workers_per_device": "--gpu-workers",
                  "partition_workers": "--partition-workers", "synthesis_threads": "--synthesis-threads",
                  "ring_slots": "--ring-slots", "param_cache": "--cache", "start_timeout_s": "--start-timeout"}
engine_option = field_key(ENGINE_OPTIONS)  # a field the bench leaves at its default keeps its own name


# Bounds on what one bench may ask for: beyond these a typo, not a benchmark (a job has at most a
# daemon request's partitions; the jobs of a run are all kept in memory with their proofs).
MAX_COUNTS = {"partitions": MAX_PARTITIONS, "jobs": 100_000, "in_flight": 1024, "repeat": 1000,
              "ring_slots": MAX_RING_SLOTS, "synthesis_threads": MAX_THREADS, "gpu_workers": MAX_THREADS}
MAX_START_TIMEOUT_S = 86_400.0
# Proofs of one bench (--jobs x --partitions x --repeat), at most: each is kept until the end with its
# timings and spans (a few KiB: ~0.5 GB at the cap) for the table, the JSON and the check of every proof
MAX_BENCH_PROOFS = 100_000


def _fill_defaults(args: argparse.Namespace, backend: str) -> None:
    """Defaults of the backend, then every option checked before any work (InputError naming it)."""
    if args.key_source != "file" and args.circuit not in SYNTHETIC_KINDS:
        raise InputError("--key-source device is for the synthetic circuits; a .zkey circuit's key is its file")
    if args.circuit in SYNTHETIC_KINDS and (args.wtns is not None or args.r1cs is not None):
        raise InputError(f"--wtns and --r1cs are for a .zkey circuit; {args.circuit} makes its own")
    if args.circuit not in SYNTHETIC_KINDS and args.log_n is not None:
        raise InputError("--log-n is for the synthetic circuits; a .zkey circuit's size is its key's")
    for key, value in DEFAULTS[backend].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.circuit in SYNTHETIC_KINDS and not MIN_LOG_N <= args.log_n <= MAX_LOG_N:
        # with the other options, before any work (the circuit's own check comes after the key step began)
        raise InputError(f"--log-n must be {MIN_LOG_N}..{MAX_LOG_N} (the synthetic circuits' sizes), "
                         f"got {args.log_n}")
    for key in ("partitions", "jobs", "in_flight", "gpu_workers", "repeat", *SHAPE_KEYS):
        value = getattr(args, key)
        if value is not None and not 1 <= value <= MAX_COUNTS.get(key, value):
            bound = f"1..{MAX_COUNTS[key]}" if key in MAX_COUNTS else ">= 1"
            raise InputError(f"--{key.replace('_', '-')} must be {bound}, got {value}")
    proofs = args.jobs * args.partitions * args.repeat
    if proofs > MAX_BENCH_PROOFS:
        raise InputError(f"--jobs {args.jobs} x --partitions {args.partitions} x --repeat {args.repeat} is {proofs} "
                         f"proofs, more than {MAX_BENCH_PROOFS} (every proof is kept until the end of the run): "
                         "ask for fewer, or run the bench several times (--json of each)")
    if not 0 < args.start_timeout <= MAX_START_TIMEOUT_S:  # also refuses nan and inf
        raise InputError(f"--start-timeout must be a number of seconds in (0, {MAX_START_TIMEOUT_S:g}], "
                         f"got {args.start_timeout}")
    _check_inputs(args)
    _check_outputs(args)


def _check_inputs(args: argparse.Namespace) -> None:
    """A .zkey circuit's files, checked before any work: each message names the option (the file's own
    reader, later, names only the path), and a --circuit that is no file may be a misspelt kind."""
    if args.circuit in SYNTHETIC_KINDS:
        return
    circuit = Path(args.circuit)
    if not circuit.is_file():
        found = "not a file" if circuit.exists() else "no such file"
        raise InputError(f"--circuit {args.circuit}: neither a synthetic kind ({', '.join(SYNTHETIC_KINDS)}) "
                         f"nor a .zkey file ({found})")
    if args.wtns is None or args.r1cs is None:
        raise InputError("--circuit ZKEY needs --wtns WITNESS.wtns and --r1cs CIRCUIT.r1cs")
    for option, path in (("--wtns", args.wtns), ("--r1cs", args.r1cs)):
        if not path.is_file():
            raise InputError(f"{option} {path}: {'not a file' if path.exists() else 'no such file'}")


def _check_outputs(args: argparse.Namespace) -> None:
    """The places the results go, checked before the run (not after it): --json and --plot are files
    (--plot in a format matplotlib writes), neither the other nor an input (the .zkey circuit, its
    --wtns, its --r1cs: the result would replace it), --proofs-dir and --cache folders."""
    from ..formats.atomic import refuse_outputs_over_inputs
    from ..paths import folder_problem, output_file_problem

    files = {"--json": args.json, "--plot": args.plot}
    folders = {"--proofs-dir": args.proofs_dir, "--cache": args.cache}
    for option, path in files.items():
        problem = None if path is None else output_file_problem(path)
        if problem is not None:
            raise InputError(f"{option} {path}: {problem}")
    for option, path in folders.items():
        problem = None if path is None else folder_problem(path)
        if problem is not None:
            raise InputError(f"{option} {path}: {problem}")
    refuse_outputs_over_inputs(args, ("json", "plot"), ("circuit", "wtns", "r1cs"))
    if args.plot is not None:
        from matplotlib.figure import Figure  # present: require_matplotlib ran first

        formats = Figure().canvas.get_supported_filetypes()
        if args.plot.suffix.lower().lstrip(".") not in formats:
            raise InputError(f"--plot {args.plot}: matplotlib writes {', '.join('.' + f for f in sorted(formats))}; "
                             f"not {args.plot.suffix or 'a file without a suffix'}")


def _circuit(args: argparse.Namespace, backend: str) -> CircuitSize:
    """The benched circuit's sizes, from its proving key (a synthetic circuit's dev key is made here,
    once, if needed) or, for a key generated in the provers (``--key-source device``), from its
    circuit data (made here, once per generator version)."""
    from .circuits import witness_map
    from .memory import circuit_data_size, circuit_size

    if args.circuit in SYNTHETIC_KINDS and args.key_source == "device":
        from .keys import ensure_synthetic_circuit_data

        with step(f"the circuit data of {args.circuit} 2^{args.log_n} in {args.cache} (made once per generator)"):
            return circuit_data_size(ensure_synthetic_circuit_data(args.circuit, args.log_n, args.cache),
                                     abc=witness_map(backend) == "host")
    return circuit_size(_zkey_path(args, backend))


def _zkey_path(args: argparse.Namespace, backend: str) -> Path:
    """The benched circuit's proving key (a synthetic circuit's dev key is made here, once, if needed)."""
    if args.circuit in SYNTHETIC_KINDS:
        from .keys import ensure_synthetic_key

        with step(f"the development key of {args.circuit} 2^{args.log_n} in {args.cache} (made once when missing)"):
            return Path(ensure_synthetic_key(args.circuit, args.log_n, args.cache, backend)[0])
    return Path(args.circuit)


def device_plan_line(circuit: CircuitSize, machine: Machine, devices: list[int], workers: int) -> str:
    """The GPU backend's device-memory plan of the benched key on the first device (its total memory:
    the prover process sees a little less free, its CUDA context's share): what the key and
    ``workers`` partitions in flight need (each worker's batch of them where the prover batches
    this circuit's partitions: :func:`~.memory.batched`), and the fallback it takes
    (docs/backend-protocol.md). A circuit whose segments hold w alone counts its device witness
    map's rows as the circuit data file's size (an upper bound: the file also holds C's rows, which
    the device map does not read)."""
    from ..backends.gpu.msm_geometry import DENSE_KEY_ROWS, MULTIPLES_ENV
    from ..backends.gpu.msm_params import graph_params_for
    from ..backends.gpu.plan import KeyShape, plan_device
    from ..errors import DeviceMemoryError
    from .memory import batched

    total = machine.gpus[0][1] if machine.gpus else 0
    if not total:
        return f"device plan: GPU {devices[0] if devices else '?'}'s memory is not known (no nvidia-smi)"
    shape = KeyShape(circuit.domain_size, circuit.n_vars, circuit.n_public)
    try:
        plan = plan_device(shape, total, workers=workers, multiples=os.environ.get(MULTIPLES_ENV) or "auto",
                           graph_params=graph_params_for(circuit.domain_size),
                           witness_map=0 if circuit.abc else circuit.data_bytes,
                           batch=batched(circuit, prover_batch(EngineConfig.prover_batch)))
    except DeviceMemoryError as exc:
        return f"device plan: GPU {devices[0]}: {exc}"
    packs = circuit.domain_size > DENSE_KEY_ROWS
    return (f"{plan.summary()} (GPU {devices[0]}, {workers} prover worker(s)"
            + ("; every section whole: the prover packs sparse B sections after the upload and plans again"
               if packs else "") + ")")


def _provers(args: argparse.Namespace, backend: str) -> list[int]:
    """The devices the engine will use (what it does with ``devices=None``)."""
    if args.devices:
        return list(args.devices)
    if backend == "cpu":
        return [0]
    from .engine import visible_gpus

    return visible_gpus()


def _gpu_table() -> dict[int, tuple[str, int]]:
    """{index: (name, memory bytes)} of this machine's NVIDIA GPUs from ``nvidia-smi`` (empty without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    gpus = {}
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            mib = float(parts[2]) if parts[2].replace(".", "", 1).isdigit() else 0.0
            gpus[int(parts[0])] = (parts[1], int(mib * 2**20))
    return gpus


def choose_backend(requested: str) -> tuple[str, str]:
    """(backend, why): ``--backend`` resolved, with the reason in words. Where the machine has an NVIDIA
    GPU but CuPy is missing or sees no device, the reason says so (the bench then runs on the CPU);
    ``--backend gpu`` where the GPU backend cannot run is an InputError saying why."""
    from ..backends import gpu_unavailable_reason, resolve_backend_name

    backend = resolve_backend_name(requested)
    if requested == "gpu":
        why = gpu_unavailable_reason()
        if why is not None:
            raise InputError(f"--backend gpu: {why}")
    if requested != "auto":
        return backend, f"--backend {requested}"
    if backend == "gpu":
        return backend, "--backend auto: CuPy sees a GPU"
    gpus = _gpu_table()
    if not gpus:
        return backend, "--backend auto: no NVIDIA GPU on this machine (no nvidia-smi)"
    why = gpu_unavailable_reason() or "CuPy sees no CUDA device"
    return backend, f"--backend auto: this machine has {len(gpus)} NVIDIA GPU(s) but {why}: falling back to the CPU"


def machine_for(backend: str, devices: list[int]) -> Machine:
    """The machine as the shape derivation sees it: cores, RAM (or the cgroup's limit), the GPUs the engine
    will use."""
    from .memory import Machine, machine_memory_bytes

    table = _gpu_table() if backend == "gpu" else {}
    gpus = tuple(table.get(d, ("?", 0)) for d in devices) if backend == "gpu" else ()
    return Machine(cores=os.cpu_count() or 1, memory_bytes=machine_memory_bytes(), gpus=gpus)


def machine_line(backend: str, why: str, machine: Machine, devices: list[int]) -> str:
    """The bench's first line: backend and why, devices, cores, host memory."""
    if backend == "gpu":
        used = ", ".join(f"GPU {d} {name} ({mem / 2**30:.0f} GiB)" for d, (name, mem) in zip(devices, machine.gpus))
    else:
        used = f"{len(devices)} CPU prover process(es)"
    return (f"cuzk-mp bench: {backend} backend ({why}); {used}; {machine.cores} cores, "
            f"{machine.memory_bytes / 2**30:.1f} GiB host memory")


def _shape(args: argparse.Namespace, backend: str, circuit: CircuitSize, machine: Machine,
           devices: list[int]) -> str:
    """Ring slots, partition workers and synthesis threads: the flags given, the rest derived from the
    machine and the partition size through the memory model (:func:`~.memory.explain_shape`) within
    ``--host-budget`` (default "auto": RAM - 4 GiB). A shape given whole goes through the same model:
    its bound is reported, and refused where it exceeds the budget (or the ring does not fit
    /dev/shm), as a derived shape is; ``--host-budget`` raises the budget for a shape the model
    overestimates. Returns the line that says what and why."""
    from ..errors import ConfigError
    from .memory import explain_shape, host_budget_bytes, shm_capacity_bytes

    given = {"ring_slots": args.ring_slots, "partition_workers": args.partition_workers,
             "threads_per_partition": args.synthesis_threads}
    given = {k: v for k, v in given.items() if v is not None}
    budget = host_budget_bytes(args.host_budget or "auto", "--host-budget", total=machine.memory_bytes)
    source = f"--host-budget {args.host_budget}" if args.host_budget else "host budget auto (RAM - 4 GiB)"
    whole = len(given) == 3
    try:
        choice = explain_shape(budget, circuit, cores=machine.cores, backend=backend, provers=len(devices),
                               prover_workers=args.gpu_workers, given=given,
                               batch=prover_batch(EngineConfig.prover_batch), shm_bytes=shm_capacity_bytes(),
                               keys=("--host-budget" if args.host_budget else "--host-budget (auto: RAM - 4 GiB)",
                                     "--ring-slots"),
                               shape_keys="--ring-slots, --partition-workers and --synthesis-threads")
    except ConfigError as e:  # an option of this command, not a config file's key
        raise InputError(str(e)) from None
    shape = choice.shape
    args.ring_slots, args.partition_workers = shape.ring_slots, shape.partition_workers
    args.synthesis_threads = shape.threads_per_partition
    if whole:
        return f"shape: all given, checked for 2^{circuit.domain_size.bit_length() - 1} rows, {source}: {choice.reason}"
    flags = f"; given: {', '.join(f'{k}={v}' for k, v in given.items())}" if given else ""
    return f"shape: derived for 2^{circuit.domain_size.bit_length() - 1} rows, {source}{flags}: {choice.reason}"


def run(args: argparse.Namespace) -> int:
    """``cuzk-mp bench``: returns 0 when every proof verified, else 2 or 1 (:func:`_verdict`)."""
    if args.plot:
        require_matplotlib()
    backend, why = choose_backend(args.backend)
    _fill_defaults(args, backend)
    devices = _provers(args, backend)
    machine = machine_for(backend, devices)
    print(machine_line(backend, why, machine, devices), flush=True)
    circuit = _circuit(args, backend)
    if args.circuit not in SYNTHETIC_KINDS:  # what the table and the JSON report: the key's own size
        args.log_n = circuit.domain_size.bit_length() - 1
    shape_line = _shape(args, backend, circuit, machine, devices)
    print(shape_line, flush=True)
    plan_line = device_plan_line(circuit, machine, devices, args.gpu_workers) if backend == "gpu" else None
    if plan_line:
        print(plan_line, flush=True)
    bench = BenchRun(args, backend, devices)
    from .. import stackprof

    sampler = stackprof.start_from_env()  # the engine's own threads (the children sample theirs)
    try:
        raw = bench.execute(circuit)
    finally:
        stackprof.finish(sampler, "engine")
    result = summarize(bench, raw)
    result["config"]["backend_reason"], result["config"]["shape_reason"] = why, shape_line
    result["config"]["device_plan"] = plan_line
    print(table(result))
    if args.proofs_dir:
        n = write_proofs(args.proofs_dir, raw["vk"], raw["runs"])
        print(f"wrote verification_key.json and {n} proof(s) to {args.proofs_dir}", flush=True)
    if args.json:
        write_result(args.json, result)
    if args.plot:
        plot_timeline(result, args.plot)
    return _verdict(result)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The ``--json`` file, whole or not at all (a previous result stays readable if this one cannot be
    written); a path that cannot take it is an OutputError naming it (exit 2), as for every output."""
    from ..formats.atomic import atomic_output

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, "w") as f:
        f.write(json.dumps(result, indent=1, default=str) + "\n")


def _verdict(result: dict[str, Any]) -> int:
    """0 when every proof verified; else one closing line on stderr saying how many did not and
    why the first failed partition failed, and exit 2 where every failure was the input's (an
    unsatisfied or malformed witness: what one-shot `groth16 prove` answers 2 for), else 1."""
    from ..errors import is_input_kind

    total, verified = result["proofs_total"], result["proofs_verified"]
    if verified == total:
        return 0
    errored = [p for p in result["partitions"] if p.get("error")]
    # a partition's failure cancels its job's other partitions: those follow, they are not causes
    failed = [p for p in errored if p.get("error_kind") != "Cancelled"] or errored
    why = (f"; {len(errored)} partition(s) not proved, {len(failed)} of them failed, the first "
           f"({failed[0]['job']} partition {failed[0]['index']}): {failed[0]['error']}") if failed \
        else "; proofs came back that do not verify"
    on_input = bool(failed) and len(errored) == total - verified and all(
        is_input_kind(p.get("error_kind")) for p in failed)
    return final_error(EXIT_INPUT if on_input else 1, f"{total - verified} of {total} proofs missing or invalid{why}",
                       prefix="cuzk-mp bench", logger=__name__)
