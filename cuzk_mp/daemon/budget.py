"""The host-memory budget: the pipeline's shape, and how many bytes of proving keys may stay resident.

The ``[memory]`` section gives one number for everything the daemon's process tree may use
(``total_budget``, "auto" = the machine's RAM) minus a ``safety_margin``, and a ``host_budget``
for the pipeline ("auto" = total - margin - queue) from which the shape is derived where the file
leaves it out (:func:`~cuzk_mp.pipeline.memory.derive_shape`: ring_slots, partition_workers,
threads_per_partition). Both use the pipeline's one memory model
(:func:`~cuzk_mp.pipeline.memory.host_bound`, docs/architecture.md "Memory"): every process's
base, the ring (ring_slots x the largest circuit's segment), each synthesis worker's and each
prover's working set, the engine's own. The daemon's queue is a term of its own, outside the
pipeline's ``host_budget``: the input bytes (circom input JSON, witnesses) its unfinished jobs keep
in memory until they finish, at most what ``[daemon] max_queued_input`` and ``max_queued_jobs``
allow (:func:`queue_bound`). What is left is the SRS budget. Every prover process
keeps its own resident keys and evicts least-recently-used ones beyond
``EngineConfig.srs_budget_bytes``, so that budget is per prover process: the SRS share divided by
the number of prover processes (``len(gpus.devices)``; 1 when the key is left out)::

    srs_total = total - margin - queue - processes x PROCESS_BASE_BYTES - pipeline
    pipeline  = engine + ring_slots x segment + partition_workers x synth + provers x prover
    queue     = min(max_queued_jobs x max_frame_bytes, max(max_queued_input, max_frame_bytes))
                (max_queued_input 0, no byte cap: max_queued_jobs x max_frame_bytes)
    srs_budget_bytes = srs_total // provers

A budget that comes out at or below zero is an impossible configuration and fails start-up with a
message naming ``memory.total_budget`` (and ``daemon.max_queued_input``, the queue's share). The
same numbers are reported by ``GetStatus`` so an operator can see where the memory goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuzk_mp.errors import ConfigError
from cuzk_mp.pipeline.memory import (
    PROCESS_BASE_BYTES, CircuitSize, Shape, derive_shape, estimated_circuit_size, host_bound, model_working_sets,
    shm_capacity_bytes,
)
from cuzk_mp.pipeline.types import prover_batch

if TYPE_CHECKING:
    from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig


@dataclass(frozen=True)
class BudgetBreakdown:
    """Where the ``[memory]`` total goes (bytes), as reported by GetStatus."""

    total: int
    safety_margin: int
    processes: int
    pipeline: int
    srs: int
    provers: int
    queue: int = 0  # the input bytes the daemon's unfinished jobs may hold (queue_bound)

    @property
    def srs_per_prover(self) -> int:
        """The budget each prover process enforces on its own keys."""
        return self.srs // self.provers

    def as_dict(self) -> dict[str, int]:
        """JSON-able form for /status."""
        return {"total": self.total, "safety_margin": self.safety_margin, "queue": self.queue,
                "processes": self.processes, "pipeline": self.pipeline, "srs": self.srs,
                "provers": self.provers, "srs_per_prover": self.srs_per_prover}


def circuit_size(spec: CircuitSpec, backend: str = "cpu") -> CircuitSize:
    """The model's view of a configured circuit on the engine's ``backend``.

    Synthetic circuits have ``2**log_n`` rows and know their wire count (building the circuit
    object costs milliseconds; its r1cs is made only on demand), and their key is estimated. For
    circom circuits the zkey header gives the sizes; it is read through a memory map, so this
    stays cheap for big keys. A key generated in the provers on the GPU travels as w alone
    (:func:`cuzk_mp.pipeline.circuits.witness_map`).
    """
    if spec.synthetic is not None:
        from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
        from cuzk_mp.pipeline.circuits import witness_map

        assert spec.log_n is not None
        size = estimated_circuit_size(1 << spec.log_n, synthetic_circuit(spec.synthetic, spec.log_n).n_wires)
        # a key generated in the provers has no host copy (and no file): nothing of it to budget on the host
        if spec.key_source != "device":
            return size
        return dataclasses.replace(size, key_bytes=0, abc=witness_map(backend) == "host")
    from cuzk_mp.pipeline.memory import circuit_size as of_zkey

    assert spec.zkey is not None
    return of_zkey(spec.zkey)


def largest(circuits: Iterable[CircuitSpec], backend: str = "cpu") -> CircuitSize:
    """The configured circuit with the largest ring segment on ``backend`` (an empty one when there is none)."""
    sizes = [circuit_size(c, backend) for c in circuits]
    return max(sizes, key=lambda s: s.segment_bytes, default=CircuitSize(0, 0, 0, 0))


def _model_backend(engine: EngineConfig) -> str:
    """The backend the engine will run ("auto" resolved as the engine resolves it: a CPU-only box is
    sized for the CPU provers, not for a GPU it does not have)."""
    from cuzk_mp.backends import resolve_backend_name

    return resolve_backend_name(engine.backend)


def shape_for(budget: int, engine: EngineConfig, circuit: CircuitSize, given: dict[str, int]) -> Shape:
    """The pipeline's shape for a host budget (``given`` values kept; the model derives the rest)."""
    provers = len(engine.devices) if engine.devices else 1
    return derive_shape(budget, circuit, backend=_model_backend(engine), provers=provers,
                        prover_workers=engine.gpu_workers_per_device, given=given,
                        batch=prover_batch(engine.prover_batch), shm_bytes=shm_capacity_bytes())


def queue_bound(max_queued_input: int, max_queued_jobs: int, max_frame_bytes: int) -> int:
    """The most input bytes the daemon's unfinished jobs hold at once, as its caps allow (the
    ``queue`` term of the budget).

    A submit is refused beyond ``max_queued_input`` bytes (0: no byte cap) unless the daemon holds
    no unfinished job, and beyond ``max_queued_jobs`` jobs; one job's inputs arrive in one frame, so
    fewer than ``max_frame_bytes``. Hence the lone job admitted into an empty daemon may bring up to
    ``max_frame_bytes`` whatever the byte cap, and the jobs cap alone bounds the bytes by
    ``max_queued_jobs x max_frame_bytes``. (Jobs restored from the journal at start are never
    refused, so a cap lowered since they were accepted holds again once they have finished.)
    """
    by_jobs = max_queued_jobs * max_frame_bytes
    if not max_queued_input:
        return by_jobs
    return min(by_jobs, max(max_queued_input, max_frame_bytes))


def breakdown(total: int, margin: int, engine: EngineConfig, circuit: CircuitSize,
              queue: int = 0) -> BudgetBreakdown:
    """Split ``total`` into margin, the daemon's queue (``queue``: :func:`queue_bound`), process bases,
    the pipeline (the model's bound) and the SRS budget."""
    provers = len(engine.devices) if engine.devices else 1
    shape = Shape(engine.ring_slots, engine.partition_workers, engine.threads_per_partition())
    keyless = CircuitSize(circuit.domain_size, circuit.n_vars, 0, 0, abc=circuit.abc)  # the keys are what is left
    ws = model_working_sets(keyless, _model_backend(engine), engine.gpu_workers_per_device,
                            prover_batch(engine.prover_batch), engine.ring_slots)
    bound = host_bound(shape, keyless, provers, ws)
    processes = (1 + engine.partition_workers + provers) * PROCESS_BASE_BYTES
    pipeline = bound.total - bound.fixed
    return BudgetBreakdown(total=total, safety_margin=margin, processes=processes, pipeline=pipeline,
                           srs=total - margin - queue - processes - pipeline, provers=provers, queue=queue)


def memory_budget(total: int, margin: int, engine: EngineConfig, circuit: CircuitSize,
                  source: str = "config", queue: int = 0) -> int:
    """The per-prover SRS budget in bytes (``EngineConfig.srs_budget_bytes``); ConfigError
    naming ``memory.total_budget`` if it is not positive."""
    b = breakdown(total, margin, engine, circuit, queue)
    if b.srs <= 0:
        raise ConfigError(
            f"{source}: memory.total_budget: {total} bytes cannot hold the safety margin "
            f"({margin}), the queued jobs' inputs ({queue}: daemon.max_queued_input), "
            f"{1 + engine.partition_workers}+ processes ({b.processes}) and the "
            f"pipeline: slot ring, worker and prover working sets ({b.pipeline}); raise it or lower "
            "pipeline.ring_slots / synthesis.partition_workers / daemon.max_queued_input")
    return b.srs_per_prover
