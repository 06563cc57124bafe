"""What ``cuzk-mp bench`` will run, settled before any process starts: its options checked, the
backend chosen (and why), the machine read, the circuit's sizes known and the pipeline's shape derived.

Every check here comes before the engine starts (minutes on a cold GPU machine, and a key to make or
load): a typo, a file that is not there or an output that cannot be written is an InputError naming
the option at once, never a failure after the run. What is derived (the shape, the device plan) is
said in words on the bench's first lines, so a reader of a result knows why it ran as it did.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..circuits.synthetic_kinds import MAX_LOG_N, MIN_LOG_N, SYNTHETIC_KINDS
from ..errors import InputError
from .benchreport import step
from .types import MAX_PARTITIONS, MAX_RING_SLOTS, MAX_THREADS, EngineConfig, field_key, prover_batch

if TYPE_CHECKING:  # imported when a bench runs (see bench.py)
    from .memory import CircuitSize, Machine

# defaults that finish in well under 5 minutes on the 2-core CPU machine / use an H200 sensibly
# (the shape, ring slots x workers x threads, is derived from the machine: see :func:`choose_shape`)
DEFAULTS = {
    "cpu": {"log_n": 14, "partitions": 10, "jobs": 3, "in_flight": 2, "gpu_workers": 2},
    "gpu": {"log_n": 20, "partitions": 10, "jobs": 4, "in_flight": 2, "gpu_workers": 2},
}
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


def fill_defaults(args: argparse.Namespace, backend: str) -> None:
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
    if args.host_budget is not None:  # its syntax now, not after the key is made (the shape needs the key's size)
        from ..errors import ConfigError
        from .memory import parse_size

        try:
            parse_size(args.host_budget, "--host-budget", allow_auto=True)
        except ConfigError as e:
            raise InputError(str(e)) from None
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
    if not os.path.isfile(args.circuit):  # the name as given: "k.zkey/" names a folder, Path("k.zkey/") the file
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
    refuse_outputs_over_inputs(args, ("json", "plot"), ("circuit", "wtns", "r1cs"), places=False)  # checked above
    if args.plot is not None:
        from matplotlib.figure import Figure  # present: require_matplotlib ran first

        formats = Figure().canvas.get_supported_filetypes()
        if args.plot.suffix.lower().lstrip(".") not in formats:
            raise InputError(f"--plot {args.plot}: matplotlib writes {', '.join('.' + f for f in sorted(formats))}; "
                             f"not {args.plot.suffix or 'a file without a suffix'}")


def bench_circuit(args: argparse.Namespace, backend: str) -> CircuitSize:
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


def prover_devices(args: argparse.Namespace, backend: str) -> list[int]:
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


def choose_shape(args: argparse.Namespace, backend: str, circuit: CircuitSize, machine: Machine,
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
