"""The host-memory budget: how many bytes of proving keys may stay resident.

The ``[memory]`` section gives one number for everything the daemon's process tree may use
(``total_budget``, "auto" = the machine's RAM) minus a ``safety_margin``. The slot ring and the
synthesis workers take a bounded share of it (DESIGN.md section 1: at most ``ring_slots`` segments
plus each worker's own vectors), and every process has a base footprint (Python + numpy + numba).
What is left is the SRS budget. Every prover process keeps its own resident keys and evicts
least-recently-used ones beyond ``EngineConfig.srs_budget_bytes``, so that budget is per prover
process: the SRS share divided by the number of prover processes (``len(gpus.devices)``; 1 when
the key is left out, where on the GPU backend the keys live in device memory anyway)::

    srs_total  = total - margin - n_procs * PROCESS_BASE_BYTES
                 - (ring_slots + partition_workers) * max_circuit(slot_bytes)
    srs_budget_bytes = srs_total // n_provers

    slot_bytes(circuit) = (3 * domain_size + n_vars) * 32      # a, b, c over the domain; w

A budget that comes out at or below zero is an impossible configuration and fails start-up with a
message naming ``memory.total_budget``. The same numbers are reported by ``GetStatus`` so an
operator can see where the memory goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuzk_mp.errors import ConfigError

if TYPE_CHECKING:
    from cuzk_mp.daemon.config import CircuitConfig
    from cuzk_mp.pipeline.types import EngineConfig

FR_BYTES = 32
# Resident set of one cuzk-mp process with numpy, numba and its compiled kernels loaded.
# Measured by perf/daemon_load.py (2^10 circuit): daemon 184 MB; one synthesis worker plus one
# CPU prover 334 MB together. Rounded up for bigger kernels' caches and arkworks buffers.
PROCESS_BASE_BYTES = 384 * 2**20


@dataclass(frozen=True)
class BudgetBreakdown:
    """Where the ``[memory]`` total goes (bytes), as reported by GetStatus."""

    total: int
    safety_margin: int
    processes: int
    pipeline: int
    srs: int
    provers: int

    @property
    def srs_per_prover(self) -> int:
        """The budget each prover process enforces on its own keys."""
        return self.srs // self.provers

    def as_dict(self) -> dict[str, int]:
        """JSON-able form for /status."""
        return {"total": self.total, "safety_margin": self.safety_margin,
                "processes": self.processes, "pipeline": self.pipeline, "srs": self.srs,
                "provers": self.provers, "srs_per_prover": self.srs_per_prover}


def slot_bytes(domain_size: int, n_vars: int) -> int:
    """Bytes of one partition's a, b, c (domain rows each) and witness (n_vars) in the ring."""
    return (3 * domain_size + n_vars) * FR_BYTES


def circuit_slot_bytes(cc: CircuitConfig) -> int:
    """Slot bytes of a configured circuit.

    Synthetic circuits have ``2**log_n`` rows and know their wire count (building the circuit
    object costs milliseconds; its r1cs is made only on demand). For circom circuits the zkey
    header gives the domain size and wire count; it is read through a memory map, so this stays
    cheap for big keys.
    """
    spec = cc.spec
    if spec.synthetic is not None:
        from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit

        assert spec.log_n is not None
        return slot_bytes(1 << spec.log_n, synthetic_circuit(spec.synthetic, spec.log_n).n_wires)
    from cuzk_mp.formats.zkey import read_zkey
    assert spec.zkey is not None
    zkey = read_zkey(spec.zkey)
    try:
        return slot_bytes(zkey.domain_size, zkey.n_vars)
    finally:
        zkey.close()


def breakdown(total: int, margin: int, engine: EngineConfig,
              circuits: Iterable[CircuitConfig]) -> BudgetBreakdown:
    """Split ``total`` into margin, process bases, pipeline reservation and the SRS budget."""
    n_devices = len(engine.devices) if engine.devices else 1
    n_procs = 1 + engine.partition_workers + n_devices
    largest = max((circuit_slot_bytes(c) for c in circuits), default=0)
    pipeline = (engine.ring_slots + engine.partition_workers) * largest
    processes = n_procs * PROCESS_BASE_BYTES
    return BudgetBreakdown(total=total, safety_margin=margin, processes=processes,
                           pipeline=pipeline, srs=total - margin - processes - pipeline,
                           provers=n_devices)


def memory_budget(total: int, margin: int, engine: EngineConfig,
                  circuits: Iterable[CircuitConfig], source: str = "config") -> int:
    """The per-prover SRS budget in bytes (``EngineConfig.srs_budget_bytes``); ConfigError
    naming ``memory.total_budget`` if it is not positive."""
    b = breakdown(total, margin, engine, circuits)
    if b.srs <= 0:
        raise ConfigError(
            f"{source}: memory.total_budget: {total} bytes cannot hold the safety margin "
            f"({margin}), {1 + engine.partition_workers}+ processes ({b.processes}) and the "
            f"slot ring + worker vectors ({b.pipeline}); raise it or lower "
            "pipeline.ring_slots / synthesis.partition_workers")
    return b.srs_per_prover
