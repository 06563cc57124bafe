"""The pipeline's host-memory model: what the process tree holds, and the shape that fits a budget.

One formula (:func:`host_bound`), used three ways: by the daemon's ``[memory]``
budget (what is left for proving keys), by ``host_budget`` (which derives
ring_slots, partition_workers and threads_per_partition, :func:`derive_shape`),
and by ``cuzk-mp bench`` (the bound it checks its measured peak against). It
counts memory the way :mod:`.monitor` measures it: PSS, so a page several
processes map (a proving key, a circuit's data) counts once, and the ring's
segments once, as shm::

    host = fixed                                   every process idle: processes x base + keys
         + engine                                  the engine's own growth (job tables, results)
         + ring_slots x segment                    exact: the ring's rule (ring.partition_segment_bytes)
         + partition_workers x synth               a worker's private memory: scratch, never the vectors
         + provers x prover                        staged partitions and H scratch (CPU backend), or
                                                   the host side of a GPU process (CUDA context,
                                                   pinned pools): the device stages from the segment

The working sets come from :func:`model_working_sets` (constants measured on the
2-core CPU machine, perf/results/pipeline-cpu-ring.json, and sizes derived from
the circuit) or, in the bench, from the measured growth of each kind of process
during the first job. Circuit data is counted once: every worker maps the same
read-only file of it (:mod:`cuzk_mp.groth16.circuit_data`; estimated here at an
int32 column and a coefficient index per matrix entry).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import ConfigError
from .ring import partition_segment_bytes
from .types import default_synthesis_threads

GiB = 2**30
MiB = 2**20
# PSS of one idle cuzk-mp process with numpy, numba and its compiled kernels loaded (measured 83 MiB for a
# synthesis worker, 87 MiB for the engine on the 2-core machine, perf/results/pipeline-cpu-ring.json;
# rounded up for bigger kernel caches and a GPU process's libraries).
PROCESS_BASE_BYTES = 192 * MiB
# What a synthesis worker holds beyond its base and the circuit's data: numba's per-thread scratch,
# an input's parsed witness before it is copied into the slot (json / wtns inputs), allocator slack,
# and the one-time cost of building a circuit's shared data file (measured 9 / 64 MiB at 2^18).
SYNTH_SCRATCH_BYTES = 64 * MiB
ENGINE_ALLOWANCE_BYTES = 64 * MiB  # job tables and results kept in the engine process
# CPU backend: a prover's memory per domain row beyond its staged copies: H's coset vectors, the MSMs'
# scalar objects, point lists and buckets (measured 1.1 KiB a row at 2^16 and 2^18, porep-like,
# perf/results/pipeline-cpu-ring.json; rounded up)
CPU_PROVER_BYTES_PER_ROW = 1536
GPU_PROVER_HOST_BYTES = 1 * GiB  # GPU backend: a prover's host memory beyond its base (CUDA context, pinned pools)
MIN_RING_SLOTS = 2  # one slot filling while another is staged
COEF_ENTRIES_PER_ROW = 2  # A and B entries per constraint row of a PoRep-shaped circuit (estimate)
DATA_BYTES_PER_ENTRY = 8  # what synthesis keeps of a matrix entry, shared: an int32 column and a coefficient index

_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: object, key: str, *, allow_auto: bool = False) -> int | None:
    """Bytes from ``"64GiB"``, ``"1.5 GB"``, ``"4096"`` or an integer; ``None`` for ``"auto"``.

    Raises ConfigError naming ``key`` for anything else (never a silent default).
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like \"64GiB\", got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: a size cannot be negative ({value})")
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        if allow_auto:
            return None
        raise ConfigError(f"{key}: \"auto\" is not allowed here; write a size like \"64GiB\"")
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key}: cannot parse size {value!r} (write e.g. \"64GiB\", \"512MiB\" "
                          "or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


AUTO_RESERVE_BYTES = 4 * GiB  # "auto" budgets leave this much of the machine's RAM to everything else


def host_budget_bytes(value: object, key: str, total: int | None = None) -> int:
    """A host budget in bytes: a size, or "auto" = ``total`` (default: the machine's RAM) minus 4 GiB."""
    size = parse_size(value, key, allow_auto=True)
    if size is not None:
        return size
    if total is None:
        import psutil

        total = int(psutil.virtual_memory().total)
    return max(0, total - AUTO_RESERVE_BYTES)


@dataclass(frozen=True)
class Shape:
    """How many slots, synthesis workers and threads per partition the pipeline runs."""

    ring_slots: int
    partition_workers: int
    threads_per_partition: int


@dataclass(frozen=True)
class CircuitSize:
    """What the model needs to know of a circuit: its partition's rows and its shared data."""

    domain_size: int
    n_vars: int
    key_bytes: int  # the zkey (mapped by the provers, counted once)
    data_bytes: int  # what synthesis reads of the circuit (matrix rows, constants), shared: counted once

    @property
    def segment_bytes(self) -> int:
        """One partition's ring segment (exact)."""
        return partition_segment_bytes(self.domain_size, self.n_vars)


@dataclass(frozen=True)
class WorkingSets:
    """Bytes each kind of process holds beyond its idle base (PSS accounting)."""

    synth: int
    prover: int
    engine: int = ENGINE_ALLOWANCE_BYTES


@dataclass(frozen=True)
class Bound:
    """The model's prediction, part by part (bytes)."""

    fixed: int
    engine: int
    ring: int
    synthesis: int
    provers: int

    @property
    def total(self) -> int:
        """The bound."""
        return self.fixed + self.engine + self.ring + self.synthesis + self.provers

    def as_dict(self) -> dict[str, int]:
        """JSON-able, with the total."""
        return {"fixed": self.fixed, "engine": self.engine, "ring": self.ring, "synthesis": self.synthesis,
                "provers": self.provers, "total": self.total}


def estimated_circuit_size(domain_size: int, n_vars: int) -> CircuitSize:
    """A circuit's sizes before its key exists: the zkey's point sections (A, B1, C and H in G1, 96
    bytes a point; B2 in G2, 192) and its coefficient section (~2 entries a row, 44 bytes each)."""
    entries = COEF_ENTRIES_PER_ROW * domain_size
    key = n_vars * (3 * 96 + 192) + domain_size * 96 + entries * 44
    return CircuitSize(domain_size=domain_size, n_vars=n_vars, key_bytes=key, data_bytes=entries * DATA_BYTES_PER_ENTRY)


def circuit_size(zkey_path: str | os.PathLike[str]) -> CircuitSize:
    """A circuit's sizes from its zkey's header (a mapping: cheap for big keys)."""
    from ..formats.zkey import read_zkey

    with read_zkey(zkey_path) as zkey:
        return CircuitSize(domain_size=zkey.domain_size, n_vars=zkey.n_vars, key_bytes=os.path.getsize(zkey_path),
                           data_bytes=int(zkey.coefs.shape[0]) * DATA_BYTES_PER_ENTRY)


def model_working_sets(circuit: CircuitSize, backend: str, prover_workers: int) -> WorkingSets:
    """Predicted working sets: a worker's scratch (never a partition's vectors); a prover's host
    memory (CPU: a private copy of each staged partition, plus H scratch and MSM scalar objects;
    GPU: a fixed allowance, as the device stages straight from the ring's segment)."""
    if backend != "cpu":
        return WorkingSets(synth=SYNTH_SCRATCH_BYTES, prover=GPU_PROVER_HOST_BYTES)
    scratch = CPU_PROVER_BYTES_PER_ROW * circuit.domain_size
    return WorkingSets(synth=SYNTH_SCRATCH_BYTES, prover=prover_workers * circuit.segment_bytes + scratch)


def fixed_bytes(processes: int, circuit: CircuitSize) -> int:
    """Every process idle, with the circuit's key and data loaded (each counted once)."""
    return processes * PROCESS_BASE_BYTES + circuit.key_bytes + circuit.data_bytes


def host_bound(shape: Shape, circuit: CircuitSize, provers: int, ws: WorkingSets, fixed: int | None = None) -> Bound:
    """The formula of the module docstring; ``fixed`` measured (bench) or modelled (:func:`fixed_bytes`)."""
    if fixed is None:
        fixed = fixed_bytes(1 + shape.partition_workers + provers, circuit)
    return Bound(fixed=fixed, engine=ws.engine, ring=shape.ring_slots * circuit.segment_bytes,
                 synthesis=shape.partition_workers * ws.synth, provers=provers * ws.prover)


def derive_shape(budget: int, circuit: CircuitSize, *, cores: int | None = None, backend: str = "gpu",
                 provers: int = 1, prover_workers: int = 2, given: dict[str, int] | None = None) -> Shape:
    """The shape that keeps :func:`host_bound` within ``budget``.

    Values in ``given`` (``ring_slots``, ``partition_workers``, ``threads_per_partition``) are
    kept. The rest follow a policy: two synthesis workers per prover (one finishing while the
    next starts), at most one per core; a slot for each worker and one more per prover (staging);
    the cores shared among the workers (and the provers, on the CPU backend:
    :func:`~.types.default_synthesis_threads`). While that does not fit, workers and then slots are
    taken away (down to one worker and two slots); ConfigError naming ``memory.host_budget`` and
    the smallest bound if even that does not fit.
    """
    cores = cores or os.cpu_count() or 1
    given = dict(given or {})
    ws = model_working_sets(circuit, backend, prover_workers)
    workers = given.get("partition_workers", max(1, min(cores, 2 * provers)))
    slots = given.get("ring_slots", max(MIN_RING_SLOTS, workers + provers))

    cpu_provers = provers if backend == "cpu" else 0

    def shape(w: int, k: int) -> Shape:
        return Shape(k, w, given.get("threads_per_partition", default_synthesis_threads(w, cpu_provers, cores)))

    def fits(w: int, k: int) -> bool:
        return host_bound(shape(w, k), circuit, provers, ws).total <= budget

    while not fits(workers, slots):
        if "partition_workers" not in given and workers > 1:
            workers -= 1
            if "ring_slots" not in given:
                slots = max(MIN_RING_SLOTS, workers + provers)
        elif "ring_slots" not in given and slots > MIN_RING_SLOTS:
            slots -= 1
        else:
            need = host_bound(shape(workers, slots), circuit, provers, ws).total
            raise ConfigError(f"memory.host_budget: {budget / GiB:.1f} GiB cannot hold the smallest pipeline for "
                              f"this circuit ({need / GiB:.1f} GiB: {slots} ring slots of "
                              f"{circuit.segment_bytes / GiB:.2f} GiB, {workers} synthesis worker(s), {provers} "
                              "prover(s), the key); raise it, or give the shape in [pipeline] and [synthesis]")
    return shape(workers, slots)
