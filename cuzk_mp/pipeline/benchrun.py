"""The runs of one bench: its engine started and the key loaded, the jobs submitted (at most
``--in-flight`` at once) and their results recorded with the memory samples, the engine stopped;
then the proofs written (``--proofs-dir``) and every one checked again against the key.

Kept apart from the figures (:mod:`.benchsummary`): this module drives processes and waits on
them; that one is arithmetic on what the runs recorded (:class:`RunResults`, ``part_done``).

What a figure is computed from is timed on ``time.monotonic()`` (a run's start, each job's and each
partition's completion), the clock the engine places its spans on: a step of the system clock during a
bench (NTP, a date set by hand) moves none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..circuits.synthetic_kinds import SYNTHETIC_KINDS
from ..errors import CuzkError, InputError
from .benchoptions import engine_option
from .benchreport import Progress, TerminalRelay, step
from .types import CircuitSpec, EngineConfig, JobResult, JobSpec, PartitionInput, PartitionResult

if TYPE_CHECKING:  # imported when a bench runs: `cuzk-mp --help` and the other verbs build the bench's
    # parser without loading the pipeline (numba, posix_ipc, psutil)
    from ..formats.snarkjs_json import VerificationKey
    from .engine import RunningEngine
    from .memory import CircuitSize
    from .monitor import MemorySampler

# smaps_rollup walks a process's mappings (4 ms for a CPU prover holding a 2^16 key): sampling the tree
# more often takes CPU time the provers of a small machine need
SAMPLE_INTERVAL_S = 0.5


@dataclass
class RunResults:
    """The jobs of one run and when each finished (``t_start``, ``t_done``: ``time.monotonic()``)."""

    t_start: float
    results: list[JobResult] = field(default_factory=list)
    t_done: dict[str, float] = field(default_factory=dict)


class BenchRun:
    """One bench invocation: engine up, key resident, runs of jobs, engine down."""

    def __init__(self, args: argparse.Namespace, backend: str, devices: list[int]) -> None:
        self.args = args
        self.backend = backend
        # what the engine will use (:func:`~.benchoptions.prover_devices`): the start step counts them
        self.devices = devices
        self.cond = threading.Condition()
        self.current = RunResults(time.monotonic())
        self.part_done: dict[tuple[str, int], float] = {}  # time.monotonic() of each completion
        self.busy_marks: list[dict[str, float]] = []  # busy seconds per prover at run 0's first job, run ends
        self.progress: Progress | None = None
        self.running: RunningEngine | None = None
        self.sampler: MemorySampler | None = None
        self.pss_first_job: dict[str, int] | None = None  # per-process peak PSS when run 0's first job ended

    def _on_partition(self, job_id: str, result: PartitionResult) -> None:
        self.part_done[(job_id, result.index)] = time.monotonic()
        if self.progress is not None:
            self.progress.advance(result.proof is not None)

    def _on_job(self, result: JobResult) -> None:
        with self.cond:
            run = self.current
            run.results.append(result)
            run.t_done[result.job_id] = time.monotonic()
            sampler = self.sampler  # the one read here, even where the bench takes it away meanwhile
            if sampler is not None:
                sampler.sample()  # every job window gets at least the sample at its end
                if self.pss_first_job is None:
                    self.pss_first_job = dict(sampler.peak_pss)
            if self.running is not None and (len(run.t_done) == 1 or len(run.t_done) == self.args.jobs):
                provers = self.running.metrics().provers
                self.busy_marks.append({name: p.busy_seconds for name, p in provers.items()})
            self.cond.notify_all()

    def _take_sampler(self) -> MemorySampler | None:
        """The memory sampler, no longer the job callbacks' to sample with: taken under the lock they
        sample under, so that a job ending as the bench stops it (a Ctrl-C) samples before or not at all."""
        with self.cond:
            sampler, self.sampler = self.sampler, None
        return sampler

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

    def one_run(self, engine: RunningEngine, circuit_id: str, fixed: list[PartitionInput], run: int) -> RunResults:
        """Submit ``jobs`` jobs, at most ``in_flight`` at a time; wait for all."""
        a = self.args
        current = RunResults(time.monotonic())
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
        """Run everything; returns the raw measurements (see :func:`summarize`). Where a progress bar is
        drawn on a terminal, the stderr of this process and of every engine child goes through a
        :class:`~.benchreport.TerminalRelay` for the engine's whole life, so no line runs onto the bar."""
        relay = None if self.args.quiet else TerminalRelay.install()
        try:
            return self._execute(circuit, relay)
        finally:
            if relay is not None:
                relay.close()

    def _execute(self, circuit: CircuitSize, relay: TerminalRelay | None) -> dict[str, Any]:
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
            self.progress = None if a.quiet else Progress(a.jobs * a.partitions * a.repeat, relay=relay)
            runs = [self.one_run(running, spec.circuit_id, fixed, r) for r in range(a.repeat)]
            if self.progress is not None:
                self.progress.close()  # drawn whole: what it put around the log lines goes
            memory = sampler.stop()  # every job has ended: no callback samples any more
            self._take_sampler()
            memory.update(idle_pss={m.name: m.pss for m in idle}, idle_uss={m.name: m.uss for m in idle},
                          idle_anon={m.name: m.anon for m in idle}, peak_pss_first_job=self.pss_first_job or {})
            status = running.status()
        except BaseException:
            # Ctrl-C or a failure: nothing will read the jobs in flight, so they are not waited for
            # (a drain would keep an interrupted bench for up to its grace, 30 s); the memory sampler,
            # which reads the engine's processes, stops first, and the progress bar before them (what the
            # stop cancels is no progress). The engine is stopped whatever ends that early: a second
            # signal (`timeout` sends SIGTERM to the bench and again to its process group) would else
            # leave it running past the bench's exit, restarting the children that signal stopped.
            try:
                if self.progress is not None:
                    self.progress.close()
                taken = self._take_sampler()
                if taken is not None:
                    with contextlib.suppress(Exception):
                        taken.stop()
            finally:
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


def write_proofs(folder: Path, vk: VerificationKey, runs: list[RunResults]) -> int:
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


def verify_all(vk: VerificationKey, runs: list[RunResults]) -> tuple[int, int]:
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
