"""The engine's typed status and metrics: what ``RunningEngine.status()`` and ``metrics()`` return.

Owns the two top-level msgspec Structs and the small ones only they use. Each
component renders its own part (the scheduler its job rows and counters, the
supervisor its process rows and degraded roles, the ring its slot records and
counters, the circuit table its resident keys, the monitor the memory of the
process tree); this module only puts them side by side. ``msgspec.to_builtins``
turns either into JSON-able data.
"""

from __future__ import annotations

import msgspec

from .circuits import KeyRow
from .monitor import ProcessMemory
from .ring import RingStats, SlotRecord
from .scheduler import JobRow, QueueStatus, SchedulerCounters
from .supervisor import Degraded, ProcessRow


class ProverStats(msgspec.Struct):
    """What a prover process reports besides proofs: kernel-busy seconds, and on the GPU backend its
    device memory and what it holds of its keys (on the device, and still mapped on the host)."""

    busy_seconds: float = 0.0
    device_used_bytes: float | None = None
    device_peak_bytes: float | None = None
    device_key_bytes: float | None = None  # resident points (and their precomputed multiples)
    device_witness_map_bytes: float | None = None  # circuits' coded rows kept for the device witness map
    host_key_resident_bytes: float | None = None  # pages of the keys' files this process still maps
    host_key_released_bytes: float | None = None  # section pages dropped after the upload
    host_pinned_bytes: float | None = None  # pinned staging buffers


class RingStatus(msgspec.Struct):
    """Every slot's record and the ring's counters."""

    slots: list[SlotRecord]
    stats: RingStats


class MemoryStatus(msgspec.Struct):
    """Host memory of the engine's process tree (monitor accounting) and each prover's device memory."""

    host_bytes: int  # PSS of the tree + shm of the ring
    host_pss_bytes: int
    host_rss_bytes: int  # for reference: counts shared pages once per process
    shm_bytes: int
    live_segments: int
    processes: list[ProcessMemory]
    device: dict[str, ProverStats]


class EngineStatus(msgspec.Struct):
    """A snapshot of a running engine."""

    state: str
    prefix: str
    backend: str
    devices: list[int]
    degraded: list[Degraded]  # empty when healthy
    queue: QueueStatus
    jobs: list[JobRow]
    processes: list[ProcessRow]
    ring: RingStatus
    srs: list[KeyRow]
    memory: MemoryStatus


class EngineMetrics(msgspec.Struct):
    """Counters and gauges of a running engine (the daemon renders them for Prometheus)."""

    state: str
    counters: SchedulerCounters
    queue: QueueStatus
    jobs_active: int
    restarts: dict[str, int]  # by role
    alive: dict[str, int]  # live processes by role
    degraded: list[Degraded]
    ring: RingStats
    shm_bytes: int
    provers: dict[str, ProverStats]  # by prover process name
