"""``cuzk-mp bench``: jobs through the real pipeline, one table, the same as JSON (docs/architecture.md).

Owns one engine for the duration of the run (prefix ``cuzk-bench-<pid>``) and
the measurement around it:

* the first (cold) job is reported apart: ``first_job_s`` runs from the first
  submit to that job's completion (key already resident: ``preload`` runs
  before the clock starts, so "cold" means cold pipeline, warm key);
* steady state per partition: ``s_per_partition = (t_last_partition_made -
  t_first_job_made) / (partitions made after t_first_job_made)`` per run, a partition being made
  where its device stage ended (:func:`~.benchsummary.made_at`: a pass's partitions complete together
  after it) (with ``--jobs 1``: that job's time / partitions, from the runs after run 0, whose one job
  is the cold one; ``steady_basis`` says which, :func:`~.benchsummary.steady_basis`), but never below
  the run's pipeline capacity (``s_per_partition_floor(_runs)``,
  :func:`~.benchsummary.capacity_s_per_partition`: the slower of the device stage's mean over the
  devices and synthesis's over the workers, over the partitions counted).
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
* host memory is sampled every ``benchrun.SAMPLE_INTERVAL_S`` with the monitor's accounting
  (PSS of the process tree, shared pages once, plus the ring's shm), with each
  process's PSS, USS and anonymous memory beside it; and at every job's end.

The first two lines say which backend runs and why, which devices, cores and host
memory (:func:`~.benchoptions.machine_line`), then the pipeline's shape and why: the flags given,
the rest derived from the machine and the partition size by the memory and
throughput model within ``--host-budget`` (default: RAM - 4 GiB;
:func:`~.memory.explain_shape`); on the GPU backend a third line gives the key's
device-memory plan (:func:`~.benchoptions.device_plan_line`).

Memory bound reported (``memory_bound``, see :func:`~.benchsummary.memory_bound`): the ring's
exact bound on live shm, and the memory model's formula (:func:`~.memory.host_bound`)
with two sets of working sets: calibrated on the first job (``bound_bytes``) and
predicted by the model alone (``model_bound_bytes``), both checked against the
sampled peak of the whole run: "held", "within tolerance" (over the first-job bound by at most
``benchsummary.BOUND_TOLERANCE`` of it, allocator noise; the table says "over by X (within the Y
tolerance)") or "exceeded" (``bound_check``, ``model_bound_check``: the model's has no tolerance).

This module is the verb: its parser, and :func:`run`, which goes through the steps in order and
says how it ended. Each step lives where it can be read alone: the options checked, the backend,
machine and shape chosen before any process starts (:mod:`.benchoptions`); the engine and the runs
of jobs (:mod:`.benchrun`); the figures above from what the runs recorded (:mod:`.benchsummary`);
the table (:mod:`.benchreport`) and the plot (:mod:`.benchplot`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..circuits.synthetic_kinds import SYNTHETIC_KINDS
from ..exit_codes import EXIT_INPUT
from ..logs import final_error
from ..paths import FileArg, default_cache_dir
from .benchoptions import (
    bench_circuit, choose_backend, choose_shape, device_plan_line, fill_defaults, machine_for, machine_line,
    prover_devices,
)
from .benchplot import plot_timeline
from .benchreport import require_matplotlib, table
from .benchrun import BenchRun, write_proofs
from .benchsummary import summarize
from .types import KEY_SOURCES


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
    p.add_argument("--wtns", type=FileArg("witness"), help="witness used for every partition of a zkey circuit")
    p.add_argument("--r1cs", type=FileArg("circuit"), help="r1cs of a zkey circuit (the witness check)")
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
    p.add_argument("--json", type=FileArg("result", output=True), help="write the result as JSON")
    p.add_argument("--proofs-dir", type=FileArg("folder", output=True, folder=True),
                   help="also write verification_key.json and every proof as "
                        "bench-RUN-JOB-PARTITION.{proof,public}.json (snarkjs files: `snarkjs groth16 verify` "
                        "checks them)")
    p.add_argument("--plot", type=FileArg("plot", output=True), help="write a timeline plot (needs matplotlib)")
    p.add_argument("--cache", type=FileArg("folder", output=True, folder=True), default=default_cache_dir(),
                   help="param cache for synthetic dev keys (default $CUZK_MP_CACHE, else $XDG_CACHE_HOME/cuzk-mp, "
                        "else ~/.cache/cuzk-mp)")
    p.add_argument("--start-timeout", type=float, default=900.0,
                   help="seconds for the processes to start (a cold GPU machine compiles its kernels first; "
                        "default 900)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run, default_log_level="INFO")  # the engine's start-up steps show while it starts


def run(args: argparse.Namespace) -> int:
    """``cuzk-mp bench``: returns 0 when every proof verified, else 2 or 1 (:func:`_verdict`)."""
    if args.plot:
        require_matplotlib()
    backend, why = choose_backend(args.backend)
    fill_defaults(args, backend)
    devices = prover_devices(args, backend)
    machine = machine_for(backend, devices)
    print(machine_line(backend, why, machine, devices), flush=True)
    circuit = bench_circuit(args, backend)
    if args.circuit not in SYNTHETIC_KINDS:  # what the table and the JSON report: the key's own size
        args.log_n = circuit.domain_size.bit_length() - 1
    shape_line = choose_shape(args, backend, circuit, machine, devices)
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
    failed = write_outputs(args, result, raw)
    verdict = _verdict(result)
    return verdict or failed


def write_outputs(args: argparse.Namespace, result: dict[str, Any], raw: dict[str, Any]) -> int:
    """The outputs asked for, the JSON result first (the run's measurements, the one a long run
    cannot give again), then the proofs and the plot, each tried whatever became of the others: a
    full disk under --proofs-dir loses no result. Returns 0, or after one closing line on stderr
    naming each output that failed and why, 2 where each was refused as a place (an OutputError,
    the exit code of every output), else 1."""
    from ..errors import CuzkError, InputError

    def proofs() -> None:
        n = write_proofs(args.proofs_dir, raw["vk"], raw["runs"])
        print(f"wrote verification_key.json and {n} proof(s) to {args.proofs_dir}", flush=True)

    outputs = (("--json", args.json, lambda: write_result(args.json, result)),
               ("--proofs-dir", args.proofs_dir, proofs),
               ("--plot", args.plot, lambda: plot_timeline(result, args.plot)))
    failed: dict[str, Exception] = {}
    for option, path, write in outputs:
        if path is None:
            continue
        try:
            write()
        except (CuzkError, OSError) as exc:
            failed[option] = exc
    if not failed:
        return 0
    code = EXIT_INPUT if all(isinstance(exc, InputError) for exc in failed.values()) else 1
    written = [f"{o} {p}" for o, p, _ in outputs if p is not None and o not in failed]
    # an error names its file where it says it (an OutputError does), else the option's path is added
    paths = {o: p for o, p, _ in outputs}
    said = [f"{o}: {e}" if str(paths[o]) in str(e) else f"{o}: {paths[o]}: {e}" for o, e in failed.items()]
    return final_error(code, "; ".join(said)
                       + (f" ({', '.join(written)} written)" if written else ""),
                       prefix="cuzk-mp bench", logger=__name__)


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
