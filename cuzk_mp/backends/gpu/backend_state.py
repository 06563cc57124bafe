"""What a GpuBackend holds: its resident keys, its staged partitions and each thread's streams.

Why a module of its own: the backend's state is read by every part of its work (keys made
resident in :mod:`.key_load` and :mod:`.key_generate`, the in-flight and batch limits in
:mod:`.device_limits`, staging in :mod:`.staging`, the proving passes in :mod:`.proving`).
:class:`_BackendState` sets every attribute they read and is the base of each of them, and so of
:class:`.backend.GpuBackend`. :class:`GpuKey` is a key made resident, :class:`GpuStaged` one
partition on the device, :class:`_Streams` a calling thread's streams and pinned bounce buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from ...errors import InputError
from ...formats.zkey import ZKey
from ...intervals import IntervalUnion
from .msm_geometry import MSM_STREAMS, msm_stream_of
from .ntt import GpuNtt
from .plan import DevicePlan
from .witness_map import DeviceWitnessMap

_H2D = 1  # cudaMemcpyHostToDevice
COPY_THREADS = 4  # host threads filling a bounce buffer (numpy copies release the GIL)


@dataclass
class GpuKey:
    """A zkey made resident: one MSM object per point section.

    ``nbytes`` counts the key's own points on the device (what the prover's key cache
    budgets); ``multiples_bytes`` the precomputed multiples on top of them (sized by
    :func:`.msm_geometry.plan_multiples` against free device memory, so never a reason to evict).
    """

    zkey: ZKey
    msms: dict[str, Any]
    counts: dict[str, int]
    nbytes: int
    multiples_bytes: int = 0
    host_released: int = 0  # bytes of key-file pages dropped after the upload
    multiples: dict[str, int] = field(default_factory=dict)  # section -> window bits of its multiples
    plan: DevicePlan | None = None  # the device-memory plan it was loaded under
    # the backend's hook, called once when the key is closed (with the key): its domain's NTT tables go
    # where no other key uses them, and its limits are computed again without it
    on_close: Callable[[GpuKey], None] | None = field(default=None, repr=False)
    # (the coded rows it was made from, their device copy): stage_witness's witness map
    witness_map: tuple[Any, DeviceWitnessMap] | None = None
    # packed section -> name of the support whose rows it keeps (see key_load.SUPPORT_SECTIONS)
    supports: dict[str, str] = field(default_factory=dict)
    support_rows: dict[str, Any] = field(default_factory=dict)  # name -> int32 device list of w's rows

    @property
    def device_bytes(self) -> int:
        """What the key holds on the device now: points, multiples, support rows, the witness map's rows."""
        wmap = self.witness_map[1].nbytes if self.witness_map is not None else 0
        return self.nbytes + self.multiples_bytes + sum(int(r.nbytes) for r in self.support_rows.values()) + wmap

    def close(self) -> None:
        """Free the device copies of the points and of the witness map's rows, then tell the backend
        (it frees the domain's NTT tables where no other resident key uses them, and its in-flight
        and batch limits grow where the key's memory was what held them down); idempotent."""
        for m in self.msms.values():
            m.close()
        self.msms = {}
        self.supports, self.support_rows = {}, {}
        if self.witness_map is not None:
            self.witness_map[1].close()
            self.witness_map = None
        self.nbytes = self.multiples_bytes = 0
        hook, self.on_close = self.on_close, None
        if hook is not None:
            hook(self)


@dataclass
class _Run:
    """Events and pending MSMs of one partition's device work."""

    events: list[tuple[str, Any, Any]] = field(default_factory=list)  # (name, start, end)
    pending: dict[str, Any] = field(default_factory=dict)


@dataclass
class GpuStaged:
    """One partition on the device: a, b, c (Montgomery), w (standard) and w's scalar plan; a
    partition staged as w alone gets its a, b, c when it computes (:meth:`GpuBackend.h_values`)."""

    device: int
    d: dict[str, Any]
    plan: Any
    ready: Any  # event: the staged data is on the device
    nbytes: int
    timings: dict[str, float] = field(default_factory=dict)
    h: Any = None
    h_ready: Any = None  # event: the H values are on the device
    canonical: np.ndarray | None = None  # pinned flag of a dense plan's deferred check (see stage)
    copy_start: Any = None  # event before the copies (h2d = copy_start .. ready)
    run: _Run = field(default_factory=_Run)
    holder: list[int] | None = None  # the staging thread's count of partitions it holds (in-flight limit)
    # staged as w alone: the map that makes a, b, c from it when the partition computes (map_witness),
    # held until its release
    witness_map: DeviceWitnessMap | None = None

    @property
    def w(self) -> Any:
        """The witness on the device, ``(n_vars, 4)`` standard form (the protocol's Staged.w)."""
        if not self.d:
            raise InputError("the partition was released")
        return self.d["w"]


class _Streams:
    def __init__(self) -> None:
        self.main = cupy.cuda.Stream(non_blocking=True)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.pool: list[Any] = []  # small keys: one stream per MSM of a pass (see msm_stream)
        self.bounce: list[np.ndarray] = []
        self.bounce_events: list[Any] = []
        self.turn = 1  # the bounce buffer filled last

    def msm_stream(self, key: GpuKey, section: str, i: int) -> Any:
        """The stream of the i-th MSM of ``section`` in a pass. A large key's MSMs keep to two
        streams (G2 on ``side``, the rest on ``main``): each fills the device. A small key's MSMs
        each get a stream of the pool, so their short, latency-bound kernels run side by side
        (the five of one proof, and those of the other proofs of a batch): :func:`.msm_geometry.msm_stream_of`,
        the rule the device plan counts the MSMs' scratch by."""
        which = msm_stream_of(int(key.zkey.domain_size), section, i)
        if which in ("main", "side"):
            return self.main if which == "main" else self.side
        if not self.pool:
            self.pool = [cupy.cuda.Stream(non_blocking=True) for _ in range(MSM_STREAMS)]
        return self.pool[int(which.removeprefix("pool"))]


class _BackendState:
    """The state of a GpuBackend on CUDA device ``device`` (see :mod:`.backend`), and each calling
    thread's streams."""

    def __init__(self, device: int = 0, in_flight: int = 1) -> None:
        self.device = device
        # partitions the caller keeps on the device at once (the prover's worker threads); a key's
        # device plan may lower it (see :meth:`load_key`), and :meth:`stage` keeps to the limit
        self.workers = max(1, int(in_flight))
        self.in_flight_limit = self.workers
        # partitions a worker may stage together (a batch), the smallest any loaded key's plan allows
        # among keys whose partitions are batched (load_key's ``batch``); None: no cap. The prover
        # takes no more at once (a thread holding a staged partition stages more without waiting,
        # so only the caller can keep a batch within its key's plan)
        self.batch_limit: int | None = None
        # the device memory this backend may use (free memory with none of its keys, tables nor partitions
        # on the device): the largest it has measured, as free + what it held then (a pass computing at
        # that moment holds scratch that is not counted, so one measure may be low, never high; the
        # prover's process is the only user of its device)
        self.device_bytes = 0
        self._staged_by = threading.local()  # partitions the calling thread holds staged
        self._slots = threading.Condition()
        self._staged_count = 0
        self._local = threading.local()
        self._lock = threading.Lock()
        self._parts: dict[int, GpuStaged] = {}  # w's device pointer -> staged partition
        self._finisher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cuzk-gpu-finish")
        self._copier = ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="cuzk-gpu-copy")
        self._keys: list[GpuKey] = []
        self._pinned_bytes = 0
        self._host_key_rss = 0  # see refresh_host_stats
        self.last_timings: dict[str, float] = {}
        self.busy_seconds = 0.0  # the union of the partitions' device spans (they overlap in flight)
        self._busy = IntervalUnion()
        self._clock: tuple[Any, float] | None = None  # (an event, its place in ms) on the device's timeline
        with cupy.cuda.Device(device):
            self.ntt_engine = GpuNtt()

    # ---- plumbing
    def streams(self) -> _Streams:
        """The calling thread's two non-blocking streams on this device."""
        s = getattr(self._local, "streams", None)
        if s is None:
            with cupy.cuda.Device(self.device):
                s = _Streams()
            self._local.streams = s
        return s

    def stream(self) -> Any:
        """The calling thread's main stream."""
        return self.streams().main
