"""The pipeline's host-memory model and throughput model: what the process tree holds, and the shape
that fits a budget and keeps the devices busy.

One formula (:func:`host_bound`), used three ways: by the daemon's ``[memory]``
budget (what is left for proving keys), by ``host_budget`` (which derives
ring_slots, partition_workers and threads_per_partition, :func:`derive_shape`),
and by ``cuzk-mp bench`` (the bound it checks its measured peak against, and its
default shape). It counts memory the way :mod:`.monitor` measures it: PSS, so a
page several processes map (a proving key, a circuit's data) counts once, and
the ring's segments once, as shm::

    host = fixed                                   every process idle: processes x base + the key's host
                                                   share + the circuit's data
         + engine                                  the engine's own growth (job tables, results)
         + ring_slots x segment                    at most: the ring's rule (segment.partition_segment_bytes)
         + partition_workers x synth               a worker's private memory: scratch, never the vectors
         + provers x prover                        staged partitions and H scratch (CPU backend), or
                                                   the host side of a GPU process (CUDA context,
                                                   pinned pools): the device stages from the segment

The working sets come from :func:`model_working_sets` (constants measured on the
2-core CPU machine, perf/results/pipeline-cpu-ring.json, and sizes derived from
the circuit) or, in the bench, from the measured growth of each kind of process
during the first job. Circuit data is counted once: every worker maps the same
read-only file of it (:mod:`cuzk_mp.groth16.circuit_data`; estimated here from its
measured size per matrix entry).

Within the budget, the shape is sized by a throughput model (GPU backend, constants
measured on the H200 box, below): enough synthesis workers x threads that synthesis
outruns the devices, on the cores the provers leave, and ring slots for every
worker's partition plus each prover's staging and ready queue (:func:`explain_shape`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import ConfigError
from ..logs import fmt_bytes
from .segment import partition_segment_bytes
from .shm_names import SHM_DIR, shm_space
from .types import BATCH_MAX_BYTES, default_synthesis_threads

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
# CPU backend, a prover batch of k small partitions (prover_batch, segments <= BATCH_MAX_BYTES): each
# partition beyond the first adds its H vector and MSM scalar objects while the pass runs, beyond its
# staged copy (measured at 2^18, porep-like, batch 8 against batch 1 on the 2-core machine: 57 MB a
# batched partition, 219 B a row, of which 128 are the staged copy; perf/results/cpu-prover-batch.json)
CPU_BATCH_BYTES_PER_ROW = 128
GPU_PROVER_HOST_BYTES = 1 * GiB  # GPU backend: a prover's host memory beyond its base (CUDA context, pinned pools)
GPU_KEY_HOST_BYTES = 256 * MiB  # GPU backend: what stays of a key on the host (header, IC points, an upload chunk)
MIN_RING_SLOTS = 2  # one slot filling while another is staged
COEF_ENTRIES_PER_ROW = 4  # A and B entries per row of a PoRep-shaped circuit (porep-like 2^24: 64.6 M, 3.85 a row)
# what synthesis keeps per A or B entry in its shared circuit data: a uint32 column and a uint16 code per entry
# of A, B and C, and the row pointers (porep-like 2^24: 741 MB for 64.6 M A and B entries, 11.5 bytes each)
DATA_BYTES_PER_ENTRY = 12

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
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ConfigError(f"{key}: a size cannot be negative ({value!r})")
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key}: cannot parse size {value!r} (write e.g. \"64GiB\", \"512MiB\" "
                          "or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


AUTO_RESERVE_BYTES = 4 * GiB  # "auto" budgets leave this much of the machine's RAM to everything else


CGROUP_ROOT = "/sys/fs/cgroup"  # where the cgroup hierarchies are mounted
PROC_CGROUP = "/proc/self/cgroup"  # this process's cgroup in each hierarchy


def cgroup_limit_files(proc_cgroup: str, root: str = CGROUP_ROOT) -> list[str]:
    """The memory-limit files that bind a process whose ``/proc/self/cgroup`` reads ``proc_cgroup``:
    its own cgroup's and every ancestor's up to the root, in the unified hierarchy (v2: ``0::/path``,
    ``memory.max``) and in v1's memory controller (``N:memory:/path``, ``memory.limit_in_bytes``). A
    systemd unit's MemoryMax= is its own cgroup's limit, not the root's; inside a container with its
    own cgroup namespace the path is ``/`` and the root's file is the container's."""
    files: list[str] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = os.path.join(root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts_of_path = [p for p in path.split("/") if p]
        for depth in range(len(parts_of_path), -1, -1):
            files.append(os.path.join(base, *parts_of_path[:depth], name))
    return files


def machine_memory_bytes() -> int:
    """The memory this process may use: the machine's RAM, or the lowest cgroup limit over its
    cgroup and their ancestors where lower (a container, a systemd unit's MemoryMax=:
    :func:`cgroup_limit_files`): "auto" budgets sized by RAM alone would be OOM-killed."""
    import psutil

    total = int(psutil.virtual_memory().total)
    try:
        with open(PROC_CGROUP) as f:
            paths = cgroup_limit_files(f.read(), CGROUP_ROOT)
    except OSError:
        paths = []
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) means no limit; v1's "no limit" is a huge number, min() drops it
            total = min(total, int(text))
    return total


def shm_capacity_bytes(path: str = SHM_DIR) -> int | None:
    """The size of the tmpfs the ring lives in (/dev/shm: a container's may be 64 MiB), or None
    where it cannot be read."""
    space = shm_space(path)
    return None if space is None else space[1]


def host_budget_bytes(value: object, key: str, total: int | None = None) -> int:
    """A host budget in bytes: a size, or "auto" = ``total`` (default: :func:`machine_memory_bytes`)
    minus 4 GiB."""
    size = parse_size(value, key, allow_auto=True)
    if size is not None:
        return size
    if total is None:
        total = machine_memory_bytes()
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
    key_bytes: int  # the zkey (mapped by the provers, counted once; 0 for a key generated on the device)
    data_bytes: int  # what synthesis reads of the circuit (matrix rows, constants), shared: counted once
    n_public: int = 0  # public signals (the device-memory plan's C section)
    abc: bool = True  # its segments hold a, b, c and w; False: w alone (the prover's device witness map)

    @property
    def segment_bytes(self) -> int:
        """One partition's ring segment (exact)."""
        return partition_segment_bytes(self.domain_size, self.n_vars, self.abc)


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
    bytes a point; B2 in G2, 192) and its coefficient section (~4 entries a row, 44 bytes each)."""
    entries = COEF_ENTRIES_PER_ROW * domain_size
    key = n_vars * (3 * 96 + 192) + domain_size * 96 + entries * 44
    return CircuitSize(domain_size=domain_size, n_vars=n_vars, key_bytes=key, data_bytes=entries * DATA_BYTES_PER_ENTRY)


def circuit_size(zkey_path: str | os.PathLike[str]) -> CircuitSize:
    """A circuit's sizes from its zkey's header (a mapping: cheap for big keys)."""
    from ..formats.zkey import read_zkey

    with read_zkey(zkey_path) as zkey:
        return CircuitSize(domain_size=zkey.domain_size, n_vars=zkey.n_vars, key_bytes=os.path.getsize(zkey_path),
                           data_bytes=int(zkey.coefs.shape[0]) * DATA_BYTES_PER_ENTRY, n_public=zkey.n_public)


def circuit_data_size(path: str | os.PathLike[str], abc: bool = True) -> CircuitSize:
    """A circuit's sizes from its circuit-data file, for a key with no file (generated in the provers:
    no host copy of the key, so ``key_bytes`` 0; the file is what synthesis and the provers map);
    ``abc`` False: its partitions travel as w alone (the prover's device witness map)."""
    from ..groth16.circuit_data_file import read_counts

    counts = read_counts(path)
    return CircuitSize(domain_size=counts.domain_size, n_vars=counts.n_vars, key_bytes=0,
                       data_bytes=os.path.getsize(path), n_public=counts.n_public, abc=abc)


def batched(circuit: CircuitSize, batch: int, ring_slots: int | None = None) -> int:
    """Partitions a prover worker takes in one pass: ``batch`` (the prover_batch cap) for partitions
    small enough to batch (:data:`~.types.BATCH_MAX_BYTES`), else one; never more than the ring's
    slots (a pass takes READY slots, and a ring of ``ring_slots`` holds no more)."""
    k = max(1, batch) if 0 < circuit.segment_bytes <= BATCH_MAX_BYTES else 1
    return min(k, max(1, ring_slots)) if ring_slots is not None else k


def model_working_sets(circuit: CircuitSize, backend: str, prover_workers: int, batch: int = 1,
                       ring_slots: int | None = None) -> WorkingSets:
    """Predicted working sets: a worker's scratch (never a partition's vectors); a prover's host
    memory (CPU: a private copy of each staged partition, a full batch (:func:`batched`, at most the
    ring's slots) for each of its workers, plus the pass's H scratch and MSM scalar objects, which
    grow with its batch; GPU: a fixed allowance, as the device stages straight from the ring's
    segment)."""
    if backend != "cpu":
        return WorkingSets(synth=SYNTH_SCRATCH_BYTES, prover=GPU_PROVER_HOST_BYTES)
    k = batched(circuit, batch, ring_slots)
    scratch = (CPU_PROVER_BYTES_PER_ROW + (k - 1) * CPU_BATCH_BYTES_PER_ROW) * circuit.domain_size
    return WorkingSets(synth=SYNTH_SCRATCH_BYTES, prover=prover_workers * k * circuit.segment_bytes + scratch)


def key_host_bytes(circuit: CircuitSize, backend: str) -> int:
    """What the provers keep of the key on the host, counted once: the whole key on the CPU backend
    (its points, converted); on the GPU backend its header and IC points and one upload chunk: the
    point sections are uploaded from the file's mapping and their pages let go, and so are the
    coefficients (:func:`~.key_cache.drop_coefficient_pages`)."""
    return circuit.key_bytes if backend == "cpu" else min(circuit.key_bytes, GPU_KEY_HOST_BYTES)


def fixed_bytes(processes: int, circuit: CircuitSize, backend: str = "cpu") -> int:
    """Every process idle, with the circuit's key (:func:`key_host_bytes`) and data loaded (each counted once)."""
    return processes * PROCESS_BASE_BYTES + key_host_bytes(circuit, backend) + circuit.data_bytes


def host_bound(shape: Shape, circuit: CircuitSize, provers: int, ws: WorkingSets, fixed: int | None = None,
               backend: str = "cpu") -> Bound:
    """The formula of the module docstring; ``fixed`` measured (bench) or modelled (:func:`fixed_bytes`)."""
    if fixed is None:
        fixed = fixed_bytes(1 + shape.partition_workers + provers, circuit, backend)
    return Bound(fixed=fixed, engine=ws.engine, ring=shape.ring_slots * circuit.segment_bytes,
                 synthesis=shape.partition_workers * ws.synth, provers=provers * ws.prover)


# ---- throughput: which shape keeps the devices busy (GPU backend)
#
# Constants measured on the H200 box (16-core Xeon, one H200, porep-like partitions), scaled linearly in the
# partition's rows. Smaller partitions cost a GPU more per row (0.056 s at 2^20, not 0.023), so the model
# asks for more synthesis than they need: the safe side.
SYNTH_CORE_S_PER_ROW = 1.95 / 2**24  # one partition's synthesis on one thread: 1.95 s at 2^24
# (perf/results/synthesis-h200-box.json: witness 0.24 + a/b/c 1.50 + check 0.21)
SYNTH_SERIAL_S_PER_ROW = 0.109 / 2**24  # wall(t) = serial + (1.95 - serial) x overhead / t: the fit of the
PARALLEL_OVERHEAD = 1.5  # pipeline's median synthesis stage at 2^24 with 5 threads (0.666 s) and 8 (0.457 s)
# (perf/results/pipeline-h200-2^24-*before-reuse.json); it also gives synthesis_bench's 4-thread wall (0.80 s
# for 0.78 measured) and overestimates its 16-thread one (0.28 for 0.22). Measured with spinning waits.
DEVICE_S_PER_ROW = 0.367 / 2**24  # the device stage (H and five MSMs) of one partition on an H200: 0.367 s
# at 2^24 (perf/results/pipeline-h200-2^24-before-reuse.json, median of 80 partitions)
PROVER_CORES = 2  # cores a GPU prover process keeps busy: staging copies (4 threads fill the pinned bounce
# buffers: ~0.5 core-s for a 2^24 partition's 2.1 GB at the 0.12 s measured for h2d), finalize, its Python threads
FEED_MARGIN = 1.4  # synthesis capacity over the devices' rate (jitter, a new segment's first touch)
READY_PER_PROVER = 2  # READY slots kept for each prover beyond the one it stages: its queue


@dataclass(frozen=True)
class Machine:
    """What the shape derivation knows of the machine (and what ``cuzk-mp bench`` prints first)."""

    cores: int
    memory_bytes: int
    gpus: tuple[tuple[str, int], ...] = ()  # (name, memory bytes) of each GPU the pipeline uses


@dataclass(frozen=True)
class ShapeChoice:
    """A derived shape and why: the throughputs it was sized for and its memory bound."""

    shape: Shape
    synthesis_rate: float  # partitions/s the synthesis workers can make (model)
    device_rate: float  # partitions/s the provers take (model; 0 where the model does not apply)
    bound: Bound
    budget: int
    reason: str


def device_seconds(circuit: CircuitSize) -> float:
    """The device stage of one partition on an H200 (model)."""
    return DEVICE_S_PER_ROW * circuit.domain_size


def synthesis_seconds(circuit: CircuitSize, threads: int) -> float:
    """Wall seconds of one partition's synthesis on ``threads`` threads (model)."""
    rows = circuit.domain_size
    if threads <= 1:
        return SYNTH_CORE_S_PER_ROW * rows
    serial = SYNTH_SERIAL_S_PER_ROW * rows
    return serial + (SYNTH_CORE_S_PER_ROW * rows - serial) * PARALLEL_OVERHEAD / threads


def synthesis_cores(cores: int, backend: str, provers: int) -> int:
    """Cores the synthesis workers share: all but the prover processes' (GPU: ``PROVER_CORES`` each)."""
    return max(1, cores - (provers * PROVER_CORES if backend != "cpu" else 0))


def ready_per_prover(circuit: CircuitSize, prover_workers: int, batch: int) -> int:
    """READY slots the ring keeps for each prover: :data:`READY_PER_PROVER`, or, for partitions small
    enough to batch (:data:`~.types.BATCH_MAX_BYTES`), a full batch for each of its workers (a worker
    takes up to ``batch`` READY partitions at once; with fewer slots the other worker finds none)."""
    k = batched(circuit, batch)
    return max(READY_PER_PROVER, prover_workers * k) if k > 1 else READY_PER_PROVER


def _gpu_shape(circuit: CircuitSize, cores: int, provers: int, given: dict[str, int],
               ready: int = READY_PER_PROVER) -> tuple[int, int, int]:
    """(workers, threads, slots) before the budget: the fewest workers (at least two, or one a device)
    whose synthesis outruns the devices by ``FEED_MARGIN``, sharing the synthesis cores; a slot
    each, and one staging plus ``ready`` (:func:`ready_per_prover`) ready ones a prover."""
    spare = synthesis_cores(cores, "gpu", provers)
    need = FEED_MARGIN * provers / device_seconds(circuit) if circuit.domain_size else 0.0

    def threads(w: int) -> int:
        return given.get("threads_per_partition", max(1, spare // w))

    def rate(w: int) -> float:  # partitions/s of w workers; a circuit of unknown size (0 rows) costs nothing
        seconds = synthesis_seconds(circuit, threads(w))
        return w / seconds if seconds > 0 else float("inf")

    if "partition_workers" in given:
        workers = given["partition_workers"]
    else:
        options = range(min(spare, max(2, provers)), spare + 1)
        workers = next((w for w in options if rate(w) >= need), max(options, key=rate))
    slots = given.get("ring_slots", max(MIN_RING_SLOTS, workers + (1 + ready) * provers))
    return workers, threads(workers), slots


def check_ring_fits_shm(slots: int, circuit: CircuitSize, shm_bytes: int | None, key: str, need: str = "") -> None:
    """ConfigError naming ``key`` where ``slots`` segments of ``circuit`` exceed ``shm_bytes`` (the tmpfs's
    size, :func:`shm_capacity_bytes`; None: no limit): a segment it has no room for would kill its writer
    with SIGBUS. ``need`` qualifies the slots ("at the least": the smallest shape the model takes)."""
    if shm_bytes is not None and slots * circuit.segment_bytes > shm_bytes:
        raise ConfigError(f"{key}: {SHM_DIR} holds {shm_bytes / GiB:.2f} GiB, less than the {slots} ring slots of "
                          f"{circuit.segment_bytes / GiB:.2f} GiB this circuit needs{' ' + need if need else ''}: "
                          "give it more (a container's --shm-size), or prove a smaller circuit")


def explain_shape(budget: int, circuit: CircuitSize, *, cores: int | None = None, backend: str = "gpu",
                  provers: int = 1, prover_workers: int = 2, given: dict[str, int] | None = None,
                  batch: int = 1, shm_bytes: int | None = None,
                  keys: tuple[str, str] = ("memory.host_budget", "pipeline.ring_slots"),
                  shape_keys: str = "[pipeline] and [synthesis]") -> ShapeChoice:
    """The shape that keeps :func:`host_bound` within ``budget`` and, on the GPU backend, the devices busy.

    Values in ``given`` (``ring_slots``, ``partition_workers``, ``threads_per_partition``) are kept.
    GPU backend: the throughput model above (:func:`_gpu_shape`). CPU backend (the provers share the
    cores and are always the slower side): two synthesis workers per prover, at most one per core,
    a slot each and one more per prover, the cores shared among workers and provers
    (:func:`~.types.default_synthesis_threads`). While the bound does not fit: ready slots beyond one
    per prover go first, then workers (the rest get more threads each), then slots down to
    ``MIN_RING_SLOTS``; ConfigError naming ``memory.host_budget`` and the smallest bound if even that
    does not fit. ``shm_bytes`` (:func:`shm_capacity_bytes`; None: no limit) caps the ring's segments
    the same way: a segment the tmpfs has no room for would kill its writer with SIGBUS. ``keys``: how
    the messages name the budget and the ring slots, and ``shape_keys`` where the whole shape is given
    instead (the daemon's config keys, or the bench's options: each reader is pointed at what it can change).
    """
    cores = cores or os.cpu_count() or 1
    given = dict(given or {})
    gpu = backend != "cpu"
    cpu_provers = 0 if gpu else provers
    spare = synthesis_cores(cores, backend, provers)
    if gpu:
        workers, _, slots = _gpu_shape(circuit, cores, provers, given,
                                       ready_per_prover(circuit, prover_workers, batch))
    else:
        workers = given.get("partition_workers", max(1, min(cores, 2 * provers)))
        slots = given.get("ring_slots", max(MIN_RING_SLOTS, workers + provers))

    def threads_for(w: int) -> int:
        if "threads_per_partition" in given:
            return given["threads_per_partition"]
        return max(1, spare // w) if gpu else default_synthesis_threads(w, cpu_provers, cores)

    def bound(w: int, k: int) -> Bound:
        ws_k = model_working_sets(circuit, backend, prover_workers, batch, ring_slots=k)
        return host_bound(Shape(k, w, threads_for(w)), circuit, provers, ws_k, backend=backend)

    def fits(w: int, k: int) -> bool:
        return bound(w, k).total <= budget and (shm_bytes is None or k * circuit.segment_bytes <= shm_bytes)

    while not fits(workers, slots):
        if "ring_slots" not in given and gpu and slots > max(MIN_RING_SLOTS, workers + provers):
            slots -= 1
        elif "partition_workers" not in given and workers > 1:
            workers -= 1
            if "ring_slots" not in given:
                slots = min(slots, max(MIN_RING_SLOTS, workers + provers))
        elif "ring_slots" not in given and slots > MIN_RING_SLOTS:
            slots -= 1
        else:
            whole = len(given.keys() & {"ring_slots", "partition_workers", "threads_per_partition"}) == 3
            check_ring_fits_shm(slots, circuit, shm_bytes, keys[1], "" if whole else "at the least")
            need = bound(workers, slots).total
            what = "the pipeline given" if whole else "the smallest pipeline"
            fix = f"lower {shape_keys}" if whole else f"give the shape with {shape_keys}"
            raise ConfigError(f"{keys[0]}: {fmt_bytes(budget)} cannot hold {what} for "
                              f"this circuit ({fmt_bytes(need)}: {slots} ring slots of "
                              f"{fmt_bytes(circuit.segment_bytes)}, {workers} synthesis worker(s), {provers} "
                              f"prover(s), the key); raise it, or {fix}")
    shape = Shape(slots, workers, threads_for(workers))
    b = bound(workers, slots)
    rate = workers / synthesis_seconds(circuit, shape.threads_per_partition) if circuit.domain_size else 0.0
    dev = provers / device_seconds(circuit) if gpu and circuit.domain_size else 0.0
    whose = "devices'" if provers > 1 else "device's"
    feed = (f"synthesis ~{rate:.1f} partitions/s for the {whose} ~{dev:.1f}/s "
            f"({device_seconds(circuit):.2f} s a partition on an H200, model)") if gpu else \
        "the CPU provers share the cores and set the pace"
    reason = (f"{workers} synthesis worker(s) x {shape.threads_per_partition} thread(s) on {spare} of {cores} cores: "
              f"{feed}; {slots} ring slots x {circuit.segment_bytes / GiB:.2f} GiB; model bound "
              f"{b.total / GiB:.1f} GiB of a {budget / GiB:.1f} GiB budget")
    return ShapeChoice(shape, rate, dev, b, budget, reason)


def derive_shape(budget: int, circuit: CircuitSize, *, cores: int | None = None, backend: str = "gpu",
                 provers: int = 1, prover_workers: int = 2, given: dict[str, int] | None = None,
                 batch: int = 1, shm_bytes: int | None = None) -> Shape:
    """:func:`explain_shape`'s shape."""
    return explain_shape(budget, circuit, cores=cores, backend=backend, provers=provers,
                         prover_workers=prover_workers, given=given, batch=batch, shm_bytes=shm_bytes).shape
