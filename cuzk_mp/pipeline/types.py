"""The public data types of the pipeline: what callers submit and what they get back.

These are the names of the engine's contract (docs/engine.md) that the daemon and
``cuzk-mp bench`` code against: plain, picklable dataclasses with no behaviour
beyond validation. The messages that travel between the engine and its child
processes are a separate concern (:mod:`.messages`), and so is the engine's
status (:mod:`.status`).

Timings in :class:`PartitionResult` are seconds, one entry per stage; every stage a
process measures for a partition reaches its result:

* ``queue_wait``  submit -> handed to a synthesis worker
* ``ring_wait``   handed over -> a free slot (backpressure), plus published -> taken by a prover
* ``shm_write``   the slot's segment created and pre-faulted (before synthesis writes into it)
* ``witness``     the witness, written into the slot (part of ``synthesis``)
* ``synthesis``   witness + a = A w, b = B w, c = a o b (+ the r1cs check), all in the slot
* ``staging``     segment -> backend memory (device copy; on the CPU backend, the prover's own memory)
* ``device_wait`` staged -> the device lock (another partition computing)
* ``device``      prove_start: H and the five MSMs
* ``finalize``    assembly with fresh r, s and the self-verification
* ``total``       submit -> result

:class:`PartitionResult` also places its stages in time (``spans``, :class:`StageSpan`): which
process ran each stage, from when to when (:mod:`.timeline` says how they are placed).

A proof is snarkjs ``proof.json`` (a dict of decimal strings) from the prover
process to the caller: it is never converted on the way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..paths import default_cache_dir

STAGES = ("queue_wait", "ring_wait", "shm_write", "witness", "synthesis", "staging", "device_wait", "device",
          "finalize", "total")
INPUT_KINDS = ("json", "wtns", "synthetic")
BACKENDS = ("auto", "cpu", "gpu")
MAX_RING_SLOTS = 256  # EngineConfig.ring_slots, at most
# EngineConfig.synthesis_threads and gpu_workers_per_device, at most: more than any machine's cores, so a
# typo; numba's pool of that many threads in each process can exhaust the process limit (the child dies
# of SIGSEGV before READY, and the message names no option)
MAX_THREADS = 1024
MAX_ENGINE_TIMEOUT_S = 30 * 86_400.0  # EngineConfig.start_timeout_s and task_timeout_s, at most
MAX_PARTITIONS = 1024  # partitions of one job, at most (a daemon request's and a bench job's)
MAX_SEED = 2**63 - 1  # a synthetic partition's seed, at most (msgpack's signed 64-bit integers)
BATCH_ENV = "CUZK_MP_PROVER_BATCH"  # overrides the configured batch cap (benchmarks: 1 = no batching)
# Partitions up to this segment size are batched (2^18 rows: 32 MiB; a, b, c and w of k partitions
# are on the device at once, and above this size the per-proof fixed costs are small beside the work).
BATCH_MAX_BYTES = 48 << 20


FINALIZE_BATCH_MAX = 16  # partitions a prover's finalizer verifies in one pairing check, at most
FINALIZE_BATCH_ENV = "CUZK_MP_FINALIZE_BATCH"  # overrides FINALIZE_BATCH_MAX (benchmarks: 1 = one at a time)


def env_count(name: str, default: int) -> int:
    """A count (>= 1) from the environment variable ``name``, ``default`` where it is unset or empty;
    ConfigError naming the variable for anything else (a typo must not become a crash in a child)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r}: must be an integer >= 1")
    return value


def prover_batch(configured: int) -> int:
    """The batch cap a prover uses: env :data:`BATCH_ENV` if set, else the configured one."""
    return env_count(BATCH_ENV, max(1, configured))


def finalize_batch() -> int:
    """The finalizer's batch cap: env :data:`FINALIZE_BATCH_ENV` if set, else :data:`FINALIZE_BATCH_MAX`."""
    return env_count(FINALIZE_BATCH_ENV, FINALIZE_BATCH_MAX)


class Priority(IntEnum):
    """Lower runs first; within a priority, jobs run in submit order."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3


@dataclass(frozen=True)
class CircuitSpec:
    """A circuit the engine can prove: a circom circuit (its zkey; a wasm to take input JSON; an r1cs to
    check each witness against its constraints, naming the first that fails: without one, an unsatisfied
    witness fails only the proof's self-verification, as a one-shot ``groth16 prove`` without --r1cs)
    or a synthetic one."""

    circuit_id: str
    zkey: Path | None = None
    wasm: Path | None = None
    r1cs: Path | None = None
    synthetic: str | None = None
    log_n: int | None = None
    partitions: int = 1
    key_source: str = "file"  # synthetic only: "file" (a dev key in the param cache) or "device" (KEY_SOURCES)


KEY_SOURCES = ("file", "device")  # where a synthetic circuit's INSECURE dev key comes from (docs/engine.md)


@dataclass(frozen=True)
class PartitionInput:
    """One partition's input: circom input JSON, a ready .wtns, or a synthetic witness seed."""

    kind: str
    data: bytes = b""
    seed: int = 0


@dataclass
class JobSpec:
    """A job: independent partitions proved with the same key, returned in order."""

    job_id: str
    circuit_id: str
    partitions: list[PartitionInput]
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True)
class StageSpan:
    """One stage of a partition in time: ``start`` and ``end`` are ``time.monotonic()`` seconds (the
    host's CLOCK_MONOTONIC, from no fixed origin), so a step of the wall clock moves no span away
    from its partition (:mod:`.timeline`); to date them, anchor the timeline with one wall-clock
    reading (:func:`~.benchplot.timeline_section`).

    ``process`` is the process that ran it (``cuzk-synth-<i>``, ``cuzk-prover-<dev>``), or
    ``ring-slot-<n>`` for the time the partition waited READY in slot n for a prover.
    """

    stage: str
    process: str
    start: float
    end: float


@dataclass
class PartitionResult:
    """The outcome of one partition: a proof (snarkjs proof.json) and its public signals, or an error.

    ``spans``: the stages of the attempt that brought the proof, placed in time (empty for a
    partition that failed).
    """

    index: int
    proof: dict[str, Any] | None
    public: list[int]
    timings: dict[str, float]
    device: int | None
    attempts: int
    error: str | None = None
    error_kind: str | None = None
    spans: list[StageSpan] = field(default_factory=list)


@dataclass
class JobResult:
    """The outcome of a job; ``partitions`` is in partition order."""

    job_id: str
    circuit_id: str
    state: str
    partitions: list[PartitionResult]
    error: str | None
    submitted_at: float
    started_at: float | None
    finished_at: float
    key_digest: str | None = None  # the key file its proofs were made with (circuits.key_digest); None: a generated key


def field_key(names: dict[str, str] | None = None) -> Callable[[str], str]:
    """How messages about the engine's config name a field: by ``names`` (what the caller sets it by:
    the daemon's config keys, the bench's options), else as ``EngineConfig.<field>``."""
    given = names or {}
    return lambda name: given.get(name, f"EngineConfig.{name}")


@dataclass
class EngineConfig:
    """How many processes and slots the engine runs (docs/engine.md describes each field).

    ``synthesis_threads`` is the number of cores one partition's synthesis uses (None:
    :func:`default_synthesis_threads`).
    """

    backend: str = "auto"
    devices: list[int] | None = None
    gpu_workers_per_device: int = 2
    partition_workers: int = 2
    synthesis_threads: int | None = None
    ring_slots: int = 4
    shm_prefix: str | None = None
    verify_proofs: bool = True
    max_attempts: int = 2
    param_cache: Path = field(default_factory=default_cache_dir)
    srs_budget_bytes: int | None = None
    start_timeout_s: float = 300.0
    # An attempt a process holds (synthesizing it, or proving it) longer than this is taken as a
    # hung process (a stopped process, a driver stuck in a call): the process is killed, and the
    # attempt retried as for any death. Generous: a 2^27 partition's whole life is ~tens of seconds.
    task_timeout_s: float = 1800.0
    prover_batch: int = 8  # READY small partitions of one key a prover worker proves in one pass, at most

    def validate(self, key: Callable[[str], str] = field_key()) -> None:
        """Raise :class:`ConfigError` naming the first bad field; ``key`` turns a field's name into the
        name the message gives it (the daemon passes its config file's keys)."""
        if self.backend not in BACKENDS:
            raise ConfigError(f"{key('backend')}: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.devices is not None and (not self.devices or len(set(self.devices)) != len(self.devices)
                                         or min(self.devices) < 0):
            raise ConfigError(f"{key('devices')}: {self.devices!r} must be distinct ids >= 0 (or None for all)")
        for name in ("gpu_workers_per_device", "partition_workers", "synthesis_threads", "ring_slots", "max_attempts",
                     "prover_batch"):
            value = getattr(self, name)
            if name == "synthesis_threads" and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key(name)}: {value!r} must be an integer >= 1")
        if self.ring_slots > MAX_RING_SLOTS:
            raise ConfigError(f"{key('ring_slots')}: {self.ring_slots} is more than {MAX_RING_SLOTS}")
        for name in ("synthesis_threads", "gpu_workers_per_device"):
            if (getattr(self, name) or 0) > MAX_THREADS:
                raise ConfigError(f"{key(name)}: {getattr(self, name)} is more than {MAX_THREADS} threads")
        if self.shm_prefix is not None and not _good_prefix(self.shm_prefix):
            raise ConfigError(f"{key('shm_prefix')}: {self.shm_prefix!r} must be 1-40 characters of [A-Za-z0-9_-]")
        if self.srs_budget_bytes is not None and self.srs_budget_bytes < 0:
            raise ConfigError(f"{key('srs_budget_bytes')}: {self.srs_budget_bytes} is negative")
        for name in ("start_timeout_s", "task_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{key(name)}: must be positive, got {getattr(self, name):g} s")
            if getattr(self, name) > MAX_ENGINE_TIMEOUT_S:
                raise ConfigError(f"{key(name)}: {getattr(self, name):g} s is more than {MAX_ENGINE_TIMEOUT_S:g} s "
                                  "(30 days): a typo, not a plan")
        prover_batch(self.prover_batch), finalize_batch()  # the environment's overrides, read by the provers
        if self.backend != "cpu":  # the GPU provers' CUZK_GPU_* knobs: a typo refused here, not in a child
            from ..backends.gpu.env_knobs import check_environment

            check_environment()

    def prefix(self) -> str:
        """The shm/semaphore name prefix: ``shm_prefix`` or ``cuzk-<pid>``."""
        return self.shm_prefix or f"cuzk-{os.getpid()}"

    def threads_per_partition(self, cpu_provers: int = 0) -> int:
        """``synthesis_threads``, or :func:`default_synthesis_threads` (``cpu_provers``: the prover
        processes that prove on the same cores, i.e. with the CPU backend)."""
        if self.synthesis_threads is not None:
            return self.synthesis_threads
        return default_synthesis_threads(self.partition_workers, cpu_provers)


def default_synthesis_threads(partition_workers: int, cpu_provers: int = 0, cores: int | None = None) -> int:
    """Cores one partition's synthesis uses unless told: the machine's cores shared among the
    synthesis workers and, with the CPU backend, the prover processes, which prove on the same
    cores (more threads than cores make every parallel step wait for a thread the scheduler
    parked: measured 0.002 s -> 0.14 s of synthesis at 2^12 on the 2-core machine)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // (partition_workers + cpu_provers))


def _good_prefix(prefix: str) -> bool:
    return 0 < len(prefix) <= 40 and all(ch.isalnum() or ch in "-_" for ch in prefix)
