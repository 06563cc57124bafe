"""GpuBackend: the Backend protocol on one CUDA device (the recipe lives in groth16/prover.py).

Device state it owns: the key's point sections (zkey sections 5..9, uploaded
straight from the key file's mapping, optionally with precomputed multiples,
wrapped in resident :class:`.msm.MsmG1` / :class:`.msm.MsmG2`), the NTT tables
(:class:`.ntt.GpuNtt`), two CUDA streams per calling thread, and each staged
partition's a, b, c, w buffers and scalar plan until :meth:`GpuBackend.release`.
Before a key's upload, its device-memory plan (:mod:`.plan`) sets how much of that
fits (which multiples: none that would take the resident keys' partitions in flight; after
the upload, the plan counts the tables really made), and the plans of every resident key
together (:mod:`.admission`, again whenever a key is closed) how many staged partitions of
any keys at once (:meth:`GpuBackend.stage` waits for a free place) and how many a worker
stages together (:attr:`GpuBackend.batch_limit`, which the prover keeps to), or a
DeviceMemoryError before any byte is uploaded.

Streams and waits. Every thread that calls the backend gets a ``main`` stream
(staging, H, the G1 MSMs) and a ``side`` stream (the G2 MSM), both non-blocking,
so one thread's staging overlaps another's compute and nothing waits for the
whole device. A small key's MSMs (domain up to 2^18) each take a stream of a
per-thread pool instead: their kernels are short chains of dependent additions
on few threads, so the five MSMs of a proof, and those of a batch, run side by
side rather than one after another; events order each after its inputs. :meth:`stage` copies a partition through pinned bounce buffers and
classifies the witness's scalars (0 / 1 / other, the only host wait of a
partition before its results); :meth:`stage_witness` copies w alone and makes a, b, c
from it on the device (:mod:`.witness_map`, the key keeping the circuit's coded rows
there). :meth:`h_values` and :meth:`msm` only enqueue:
G2 starts first on the side stream (after an event that marks the staged data
ready), the G1 MSMs and the H step follow on the main stream, and each
:meth:`msm` returns a Future that a finisher thread completes when that MSM's
result copy has landed (its host part, Horner over the window sums, runs there).

Timings: ``last_timings`` holds ms per stage of the last released partition from
CUDA events (h2d, ntt_h, msm_a, msm_b1, msm_b2, msm_c, msm_h, total = first event
to last, with G2 overlapping the rest); ``busy_seconds`` is the union of the partitions'
spans (two in flight overlap: counted once; the pipeline's GPU-busy fraction). :meth:`stats` says what the backend
holds on the host and the device.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ...errors import DeviceMemoryError, InputError, ResourceError
from ...formats.zkey import ZKey
from ...intervals import IntervalUnion
from ..base import G2_ROW_COST, ProverInputs, WitnessRows, check_key_sections
from . import fixed_base, hostmem, memory
from . import msm as gmsm
from . import msm_plan
from .knobs import FixedBaseParams
from .msm_geometry import DENSE_KEY_ROWS, MSM_STREAMS, MULTIPLES_ENV, SECTIONS, batches_msms, msm_stream_of
from .msm_params import graph_params_for, msm_params_for
from .admission import DeviceAdmission, admit
from .ntt import GpuNtt
from .plan import DROP_ORDER, DevicePlan, KeyShape, ntt_table_bytes, plan_device, point_words
from .witness_map import DeviceWitnessMap, LongRows, matrices_bytes

log = logging.getLogger("cuzk_mp.backends.gpu.backend")

_H2D = 1  # cudaMemcpyHostToDevice
BOUNCE_BYTES = 64 << 20  # one pinned staging buffer at most (two per thread)
MIN_BOUNCE_BYTES = 1 << 20
PARALLEL_COPY_BYTES = 8 << 20  # below this a bounce buffer is filled by one thread
W_SECTIONS = ("a", "b1", "b2")  # the MSMs over the whole witness: one plan, so they share its sorts
# The sections whose support (rows whose point is not infinity) may make them packed, most
# valuable first (G2 first): the key keeps only those rows' points (and multiples) and their MSMs
# take only those rows' scalars, gathered once a partition (ScalarPlan.subsets). A section stays
# whole unless at most SUPPORT_MAX_FRACTION of its rows have a point: below that, the entries and
# the memory saved outweigh the second classification and a sort no longer shared with A. At most
# one support per key (the first sparse section's; the others join it where their rows are the
# same), and only on keys above DENSE_KEY_ROWS (the 0/1-split path that classifies w); the device
# plan counts the packed rows, the gathered scalars and their index lists (plan.KeyShape.packed).
SUPPORT_SECTIONS = ("b2", "b1", "a")
SUPPORT_MAX_FRACTION = 0.9
COPY_THREADS = 4  # host threads filling a bounce buffer (numpy copies release the GIL)
GEN_CHUNK_ROWS = 1 << 22  # scalars uploaded at a time by generate_key (128 MiB)


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
    # packed section -> name of the support whose rows it keeps (see SUPPORT_SECTIONS)
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


class GpuBackend:
    """The Backend protocol on CUDA device ``device`` (see the module docstring)."""

    name = "gpu"
    h_early = True  # h_values and msm only enqueue: the H chain starts right after G2
    witness_on_device = True  # stage_witness: a, b, c made on the device from w

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

    def stats(self) -> dict[str, float]:
        """What the backend holds: ``busy_seconds``; ``device_key_bytes`` (resident points and
        their multiples); ``device_witness_map_bytes`` (the circuits' coded rows kept on the device
        for the witness map); ``host_key_resident_bytes`` (pages of the loaded keys' files this process
        still maps); ``host_key_released_bytes`` (section pages dropped after upload);
        ``host_pinned_bytes`` (staging buffers). Cheap (every proof reports it): the resident bytes
        are those :meth:`refresh_host_stats` last read."""
        keys = [k for k in self._keys if k.msms]
        return {
            "busy_seconds": float(self.busy_seconds),
            "device_key_bytes": float(sum(k.nbytes + k.multiples_bytes for k in keys)),
            "device_witness_map_bytes": float(sum(k.witness_map[1].nbytes for k in keys if k.witness_map)),
            "host_key_resident_bytes": float(self._host_key_rss),
            "host_key_released_bytes": float(sum(k.host_released for k in keys)),
            "host_pinned_bytes": float(self._pinned_bytes),
        }

    # ---- keys
    def refresh_host_stats(self) -> None:
        """Read how much of the loaded keys' files this process still maps (``/proc/self/smaps``: tens of
        milliseconds in a process with a CUDA context, so never on a proof's path): after each key
        load (of a lasting key), and periodically from the prover's memory-watch thread."""
        with self._lock:
            arrays = [getattr(k.zkey, name) for k in self._keys if k.msms for name in SECTIONS]
        self._host_key_rss = hostmem.mapped_rss([a for a in arrays if a is not None])

    def load_key(self, zkey: ZKey, *, lasting: bool = True, witness_rows: WitnessRows | None = None,
                 batch: int = 1) -> GpuKey:
        """Plan the device memory (:func:`.plan.plan_device`: points, multiples, NTT tables,
        the partitions in flight and their MSM scratch, against free memory; it drops multiples,
        then lowers :attr:`in_flight_limit`, or raises DeviceMemoryError before any upload), then
        upload sections 5..9 (A, B1, B2, C, H) from the key's mapping, chunk by chunk, let the
        host pages go (from the page cache too for a lasting key: a key for one proof leaves its file
        cached for the next process), and build the resident MSM objects (with precomputed multiples for the
        sections the plan keeps; env ``CUZK_GPU_MSM_MULTIPLES``, default "auto"). A key for one
        proof (``lasting=False``) gets no multiples unless that env names some: building them
        costs more than they save in one proof (2 s per 2^24 G1 section, 5.4 s for G2).
        ``witness_rows``: the circuit's coded rows when its partitions will come as w alone
        (:meth:`stage_witness`): the plan counts their device copy (not uploaded here). ``batch``: the
        most partitions of this key a worker stages and computes together (the caller's batch; the
        plan may lower it: :attr:`batch_limit`)."""
        host = {name: getattr(zkey, name) for name in SECTIONS}
        for name, arr in host.items():
            width = point_words(name)
            if arr is None or arr.ndim != 2 or arr.shape[1] != width or arr.dtype != np.uint64:
                raise InputError(f"zkey section {name}: expected (n, {width}) uint64 points, got "
                                 f"{None if arr is None else (arr.dtype, arr.shape)} (a closed key?)")
        released = 0

        def upload(s: Any) -> dict[str, Any]:
            nonlocal released
            dev = {}
            for name, arr in host.items():
                dev[name] = cupy.empty(arr.shape, dtype=np.uint64)
                released += _upload_release(dev[name], arr, s, drop_cache=lasting)
            return dev

        return self._resident(zkey, lasting, upload, lambda: released, witness_rows, batch=batch)

    def generate_key(self, head: ZKey, sections: Sequence[tuple[str, str, Callable[[], np.ndarray]]], *,
                     lasting: bool = True, witness_rows: WitnessRows | None = None, batch: int = 1) -> GpuKey:
        """Make a key resident from its sections' scalars instead of a file (the dev setup of
        :func:`cuzk_mp.groth16.setup_resident.setup_resident`): the same plan as :meth:`load_key`,
        then for each ``(section, "g1" | "g2", scalars())`` the fixed-base kernel writes s_i G
        straight into the section's device array (scalars uploaded GEN_CHUNK_ROWS at a time; each
        section's host scalars dropped once its points exist), then the same MSM objects. The sections'
        scalars are made in order on a helper thread, ahead of the kernels (the QAP columns, C's
        scaling and H's ratios are seconds of host work each at 2^27; their numba kernels let the GIL
        go): the host holds at most the scalars not yet turned into points. A key above
        DENSE_KEY_ROWS gets its sparse whole-witness sections packed as they are made: only the rows
        whose scalar is not 0 get a point (:func:`_fixed_base_support`), so the whole section (26 GB
        for the 2^27 PoRep-like B2) is never allocated nor gathered from."""
        check_key_sections([name for name, _, _ in sections])
        rows = KeyShape.of(head).rows()
        work = {name: rows[name] * (G2_ROW_COST if group == "g2" else 1) for name, group, _ in sections}
        pack = int(head.domain_size) > DENSE_KEY_ROWS
        known: dict[str, Any] = {}  # name -> int32 device rows with a point, of the sections made packable

        def generate(s: Any) -> dict[str, Any]:
            dev = {}
            t0 = time.perf_counter()
            done, total = 0, sum(work.values())
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuzk-gpu-keygen") as pool:
                # every section's scalars made in order on the helper thread, as far ahead of the kernels
                # as it gets, not one section ahead: a section whose scalars take longer than the last
                # one's points no longer leaves the device idle while the host catches up
                upcoming: list[Any] = [pool.submit(make) for _, _, make in sections]
                try:
                    for i, (name, group, _) in enumerate(sections):
                        scalars = upcoming[i].result()
                        upcoming[i] = None  # the future held the scalars: gone once their points are made
                        if pack and name in SUPPORT_SECTIONS:
                            dev[name], known[name] = _fixed_base_support(s, name, group, scalars, rows[name])
                        else:
                            dev[name] = _fixed_base_rows(s, name, group, scalars, rows[name])
                        del scalars
                        done += work[name]
                        log.info("key %s: section %s generated (%d points of %d rows); %.0f%% of the key in %.1f s",
                                 head.path or "", name, int(dev[name].shape[0]), rows[name],
                                 100.0 * done / max(total, 1), time.perf_counter() - t0)
                finally:
                    for f in upcoming:
                        if f is not None:
                            f.cancel()
            return dev

        return self._resident(head, lasting, generate, lambda: 0, witness_rows, known, batch)

    def _resident(self, zkey: ZKey, lasting: bool, fill: Callable[[Any], dict[str, Any]],
                  released: Callable[[], int], witness_rows: WitnessRows | None = None,
                  known: dict[str, Any] | None = None, batch: int = 1) -> GpuKey:
        """Plan (with the device witness map's rows of ``witness_rows``, which its first partition
        uploads), then ``fill(stream)`` -> the sections' device arrays (``known``, filled by
        ``fill``: name -> the int32 rows with a point of the sections it made, packed or whole, as
        :meth:`_pack` takes them), then the MSM objects and the NTT tables; the key registered with
        its in-flight limit and its batch (``batch`` partitions asked)."""
        shape = KeyShape.of(zkey)
        sizes = shape.section_bytes()
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            choice = os.environ.get(MULTIPLES_ENV, "").strip() or ("auto" if lasting else "none")
            wmap = 0 if witness_rows is None else matrices_bytes(witness_rows.a, witness_rows.b,
                                                                  witness_rows.table_mont, witness_rows.table_r2)
            free = memory.free_bytes()[0]

            def planned(key_shape: KeyShape, multiples: str | None = None, made: bool = False) -> DevicePlan:
                return plan_device(key_shape, free, workers=self.workers, multiples=multiples or choice,
                                   graph_params=graph_params_for(int(shape.domain_size)), witness_map=wmap,
                                   batch=batch, made=made)

            # every section whole: the upper bound, checked before any upload
            dplan, together = self._beside(planned(shape), lambda m: planned(shape, m), zkey.path or "")
            log.info("key %s: %s", zkey.path or "", dplan.summary())
            if len(together.plans) > 1:
                log.info("key %s beside the resident keys: %s", zkey.path or "", together.summary())
            if not together.fits:
                raise DeviceMemoryError(together.refusal())
            memory.ensure_free(sum(sizes.values()), f"the proving key {zkey.path or ''} (sections 5..9)")
            msms: dict[str, Any] = {}
            try:
                t0 = time.perf_counter()
                dev = fill(s)
                t_fill = time.perf_counter()
                supports, rows = self._pack(dev, int(zkey.domain_size), zkey.path or "", shape.rows(), known or {})
                t_pack = time.perf_counter()
                key_shape = shape
                if supports:  # the same plan with the packed sections' rows: what the key really needs
                    key_shape = replace(shape, packed=tuple((n, int(dev[n].shape[0])) for n in supports))
                    dplan, _ = self._beside(planned(key_shape), lambda m: planned(key_shape, m), zkey.path or "")
                    log.info("key %s, %s packed: %s", zkey.path or "", " and ".join(supports), dplan.summary())
                points = sum(int(dev[name].nbytes) for name in SECTIONS)
                tables: dict[str, Any] = {}
                for name, c in dplan.multiples.items():
                    mult = self._multiples(dev[name], c, name)
                    if mult is not None:
                        tables[name] = mult
                        dev[name] = mult.table[: mult.n]
                if tables.keys() != dplan.multiples.keys():
                    # some found no room: the plan of those made, which counts what is on the device
                    # (the MSMs of the others need their own scratch, often more than a table saves)
                    dplan = planned(key_shape, ",".join(tables) or "none", made=True)
                    log.info("key %s with the multiples made (%s): %s", zkey.path or "",
                             ", ".join(tables) or "none", dplan.summary())
                for step in dplan.steps:
                    log.warning("key %s does not fit as configured: %s", zkey.path or "", step)
                for name in SECTIONS:
                    cls = gmsm.MsmG2 if name == "b2" else gmsm.MsmG1
                    params = dplan.msm_params(msm_params_for(int(dev[name].shape[0])))
                    msms[name] = cls(dev[name], replace(params, graphs=params.graphs and dplan.graphs),
                                     tables.get(name))
                t_msms = time.perf_counter()
                n = int(zkey.domain_size)
                if n >= 2 and n & (n - 1) == 0:
                    self.ntt_engine.plan(n.bit_length() - 1)  # the H step's tables, before any partition
                s.synchronize()
                t_end = time.perf_counter()
                log.info("key %s resident in %.1f s: sections %.1f s, packing %.1f s, plan, multiples and MSM "
                         "objects %.1f s, NTT tables %.1f s", zkey.path or "", t_end - t0, t_fill - t0,
                         t_pack - t_fill, t_msms - t_pack, t_end - t_msms)
            except BaseException:
                for m in msms.values():
                    m.close()
                raise
        key = GpuKey(zkey, msms, shape.rows(), points, sum(int(m.nbytes) for m in msms.values()) - points,
                     released(), {n: t.c for n, t in tables.items()}, dplan, supports=supports, support_rows=rows,
                     on_close=self._key_closed)
        with self._lock:
            self._keys = [k for k in self._keys if k.msms] + [key]
        self._set_limits()
        if lasting:  # a key for one proof: nobody reads the figure, and smaps costs a one-shot prove ~20 ms
            self.refresh_host_stats()
        return key

    def _admission(self, new: DevicePlan | None = None) -> DeviceAdmission:
        """The resident keys' plans (and ``new``'s: a key about to be uploaded) together
        (:func:`.admission.admit`), against the device memory this backend may use: :attr:`device_bytes`,
        measured again here as the free memory plus what the backend holds now (its keys, NTT tables
        and staged partitions)."""
        with self._lock:
            keys = [k for k in self._keys if k.msms]
            held = sum(k.device_bytes for k in keys) + sum(p.nbytes for p in self._parts.values())
        built = self.ntt_engine.domain_sizes()
        held += sum(ntt_table_bytes(n) for n in built)
        self.device_bytes = max(self.device_bytes, memory.free_bytes()[0] + held)
        plans = [k.plan for k in keys if k.plan is not None] + ([new] if new is not None else [])
        domains = set(built) | {p.shape.domain_size for p in plans}
        return admit(plans, self.device_bytes, workers=self.workers,
                     tables=sum(ntt_table_bytes(n) for n in domains))

    def _beside(self, dplan: DevicePlan, replan: Callable[[str], DevicePlan],
                path: str) -> tuple[DevicePlan, DeviceAdmission]:
        """A key's plan ``dplan`` (made against the memory free now) and its admission beside the
        resident keys, its precomputed multiples dropped first, in :data:`.plan.DROP_ORDER`
        (``replan``: the key's plan with a comma list of the sections that keep theirs), while they
        cost partitions in flight: while the admission keeps smaller batches or fewer partitions in
        flight than with none of them (none is dropped where they save more MSM scratch than their
        tables take). The free memory they were sized against is the resident keys' room for their
        partitions; multiples are a speed-up only, and a key's own plan drops them before its
        batches and partitions in flight too. Only the new key's: the resident keys' are made, and
        dropping them would mean making them again when the room comes back."""
        together = self._admission(dplan)
        if not dplan.multiples or len(together.plans) == 1:
            return dplan, together
        bare = self._admission(replan("none"))
        dropped: list[str] = []
        for s in DROP_ORDER:
            if (together.fits, together.batch, together.in_flight) >= (bare.fits, bare.batch, bare.in_flight):
                break
            if s in dplan.multiples:
                dplan = replan(",".join(k for k in dplan.multiples if k != s) or "none")
                together = self._admission(dplan)
                dropped.append(s)
        if dropped:
            log.warning("key %s: without the precomputed multiples of %s, which would take the resident keys' "
                        "partitions in flight", path, ", ".join(dropped))
        return dplan, together

    def _key_closed(self, key: GpuKey) -> None:
        """After ``key`` is closed: its domain's NTT tables go where no resident key has that domain
        (kept, they would stay for the engine's life, one set per size the backend ever proved, and
        hold the remaining keys' limits down), then the limits are computed again without the key. A key of that domain
        being loaded at the same moment (tables built, key not yet registered) builds them again at
        its first H step; its admission counted them."""
        n = int(key.zkey.domain_size)
        with self._lock:
            shared = any(int(k.zkey.domain_size) == n for k in self._keys if k.msms)
        if not shared:
            with cupy.cuda.Device(self.device):
                self.ntt_engine.release(n)
        self._set_limits()

    def _set_limits(self) -> None:
        """:attr:`in_flight_limit` and :attr:`batch_limit` from the resident keys together (after a
        key's load, and after a key's close: its memory is free again). A stage waiting for a place
        sees the new limit at once."""
        together = self._admission()
        if together.plans:
            level = logging.INFO if together.fits else logging.WARNING
            log.log(level, "GPU %d: %s", self.device, together.summary())
        with self._slots:
            self.in_flight_limit = together.in_flight if together.plans else self.workers
            self.batch_limit = together.batch_limit
            self._slots.notify_all()

    @staticmethod
    def _pack(dev: dict[str, Any], domain_size: int, path: str, n_rows: dict[str, int],
              known: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        """Pack the key's sparse whole-witness sections in ``dev`` (keys above DENSE_KEY_ROWS):
        the first of :data:`SUPPORT_SECTIONS` with at most :data:`SUPPORT_MAX_FRACTION` of its rows
        not at infinity gives the support's rows, the others that have exactly those rows join it
        (and share their plan's sorts), and each such section keeps only those rows' points.
        ``known``: the rows with a point of sections whose makers know them (:func:`_fixed_base_support`),
        not read again from the points; such a section may come packed already (fewer rows than its
        ``n_rows``), and is made whole again should it not join the support.
        Returns (section -> support name, name -> int32 device rows); ({}, {}) when nothing is packed."""
        if domain_size <= DENSE_KEY_ROWS:
            return {}, {}
        supports: dict[str, str] = {}
        first: tuple[str, Any] | None = None  # (name, rows) of the first sparse section
        made_packed = {name for name in known if name in dev and int(dev[name].shape[0]) < n_rows[name]}
        for name in SUPPORT_SECTIONS:
            if name not in dev:
                continue
            n = n_rows[name]
            rows = known[name] if name in known else msm_plan.support_rows(dev[name])
            if first is None:
                if n and int(rows.shape[0]) <= SUPPORT_MAX_FRACTION * n:
                    first = (name, rows)
                    supports[name] = name
                    log.info("key %s: section %s has points on %d of its %d rows: it keeps those alone",
                             path, name, int(rows.shape[0]), n)
            elif _same_rows(rows, first[1]):  # one row per wire
                supports[name] = first[0]
        for name in made_packed - set(supports):  # its rows are not the support's: whole again
            memory.ensure_free(n_rows[name] * int(dev[name].shape[1]) * 8, f"unpacking key section {name}")
            whole = cupy.zeros((n_rows[name], int(dev[name].shape[1])), dtype=np.uint64)
            whole[known[name]] = dev[name]
            dev[name] = whole
        if first is None:
            return {}, {}
        gathered = [name for name in supports if name not in made_packed]
        for name in gathered:
            packed_bytes = int(first[1].shape[0]) * int(dev[name].shape[1]) * 8
            memory.ensure_free(packed_bytes, f"packing key section {name}")
            dev[name] = dev[name][first[1]]  # the whole section goes back to the pool
        if gathered:
            # ... and from the pool to the driver: left there, its blocks (tens of GiB at 2^27) get split
            # by the partitions' arrays and the sorts' buffers (seen once at 2^27 without this: an H MSM's
            # sort ran out of device memory while the plan's total was well within the device)
            cupy.cuda.get_current_stream().synchronize()
            cupy.get_default_memory_pool().free_all_blocks()
        return supports, {first[0]: first[1]}

    @staticmethod
    def _multiples(d_points: Any, c: int | None, name: str) -> Any:
        """The multiples table of one resident section (None without c, or when the device has
        no room for it now: the section then runs without, and the log says so)."""
        if c is None:
            return None
        w = gmsm.window_count(c)
        n, width = int(d_points.shape[0]), int(d_points.shape[1])
        scratch = min(FixedBaseParams().chunk, n) * 5 * (width // 2) * 8
        try:
            memory.ensure_free(w * int(d_points.nbytes) + scratch, f"precomputed multiples of key section {name}")
        except ResourceError as exc:
            log.warning("key section %s runs without precomputed multiples: %s", name, exc)
            return None
        return gmsm.Multiples(fixed_base.multiples_table(d_points, c, w), c, w, n)

    # ---- partitions
    def stage(self, key: GpuKey, inputs: ProverInputs) -> GpuStaged:
        """Copy a, b, c, w to the device on this thread's main stream and classify w's scalars
        (a key up to :data:`DENSE_KEY_ROWS`: a dense plan, and the check that every scalar is
        canonical is read when the MSMs' results are, so nothing here waits for the device); on
        return the host vectors are no longer read (the caller may free them)."""
        z = key.zkey
        shapes = {"a": (z.domain_size, 4), "b": (z.domain_size, 4), "c": (z.domain_size, 4), "w": (z.n_vars, 4)}
        host = {k: np.ascontiguousarray(getattr(inputs, k), dtype=np.uint64) for k in shapes}
        for k, shape in shapes.items():
            if host[k].shape != shape:
                raise InputError(f"partition vector {k} has shape {host[k].shape}, the key expects {shape}")
        return self._stage(key, host, None, "staging a partition (a, b, c, w)")

    def stage_witness(self, key: GpuKey, rows: WitnessRows, w: np.ndarray) -> GpuStaged:
        """Copy w; a, b, c are computed from it on the device (:mod:`.witness_map`) when the
        partition computes, so a staged partition waiting for the device holds w alone (the device
        plan counts it so: :func:`.plan.partition_bytes`). The key keeps the circuit's coded rows on
        the device from its first such partition (for the same ``rows`` object; another one
        replaces them). ``w`` must be canonical (the caller validates it)."""
        z = key.zkey
        w = np.ascontiguousarray(w, dtype=np.uint64)
        if w.shape != (z.n_vars, 4):
            raise InputError(f"witness has shape {w.shape}, the key expects {(z.n_vars, 4)}")
        with cupy.cuda.Device(self.device), self._lock:
            if key.witness_map is None or key.witness_map[0] is not rows:
                if key.witness_map is not None:  # rare (another evaluator for this key): let every
                    cupy.cuda.Device().synchronize()  # thread's map that reads the old rows finish first
                    old = key.witness_map[1]
                    key.witness_map = None
                    # a partition staged with the old rows and not yet computed keeps them (its own
                    # reference, dropped at its release, once the device is done with them)
                    if not any(p.witness_map is old for p in self._parts.values()):
                        old.close()
                long = LongRows.of(rows.a, rows.b)
                memory.ensure_free(matrices_bytes(rows.a, rows.b, rows.table_mont, rows.table_r2, long),
                                   "the witness map's coded rows")
                key.witness_map = (rows, DeviceWitnessMap(rows.a, rows.b, rows.table_mont, rows.table_r2,
                                                          z.domain_size, long))
            wmap = key.witness_map[1]
        return self._stage(key, {"w": w}, wmap, "staging a partition (w alone; a, b, c made from it later)")

    def _stage(self, key: GpuKey, host: dict[str, np.ndarray], wmap: DeviceWitnessMap | None,
               what: str) -> GpuStaged:
        """Copy ``host``'s vectors on this thread's main stream (with ``wmap``: w alone, the map kept
        for :meth:`h_values`) and classify w (see :meth:`stage`)."""
        z = key.zkey
        st = self.streams()
        holder = self._take_stage_slot()
        try:
            with cupy.cuda.Device(self.device), st.main:
                rows = {k: z.domain_size for k in "abc" if wmap is None} | {"w": z.n_vars}
                memory.ensure_free(32 * sum(rows.values()), what)
                start = cupy.cuda.Event()
                start.record(st.main)
                d = {k: cupy.empty((n, 4), dtype=np.uint64) for k, n in rows.items()}
                for k, v in host.items():
                    self._h2d(d[k], v, st)
                t0 = time.perf_counter()
                canonical = None
                if int(z.domain_size) <= DENSE_KEY_ROWS:
                    canonical = msm_plan.check_canonical(d["w"], st.main)
                    plan = msm_plan.dense_plan(int(d["w"].shape[0]))
                    ready = _record(st.main)
                else:
                    ready = _record(st.main)
                    plan = msm_plan.classify(d["w"], cuts=(z.n_public + 1,), supports=key.support_rows)  # waits
                    plan.sorts = msm_plan.SharedSorts.for_msms(
                        [key.msms[s] for s in W_SECTIONS if s in key.msms and s not in key.supports], plan.n2)
                    for name, sub in plan.subsets.items():
                        sub.sorts = msm_plan.SharedSorts.for_msms(
                            [key.msms[s] for s, g in key.supports.items() if g == name and s in key.msms], sub.n2)
                timings = {"classify": 1e3 * (time.perf_counter() - t0)}
        except BaseException:
            self._free_stage_slot(holder)
            raise
        nbytes = sum(int(a.nbytes) for a in d.values()) + sum(int(p.scalars.nbytes) for p in plan.subsets.values())
        staged = GpuStaged(self.device, d, plan, ready, nbytes, timings,
                           holder=holder, canonical=canonical, copy_start=start, witness_map=wmap)
        with self._lock:
            self._parts[int(d["w"].data.ptr)] = staged
        return staged

    def _take_stage_slot(self) -> list[int]:
        """Wait until fewer than :attr:`in_flight_limit` partitions are staged, unless the calling
        thread already holds one (a worker staging a batch never waits for itself); count one more."""
        held = getattr(self._staged_by, "held", None)
        if held is None:
            held = self._staged_by.held = [0]
        with self._slots:
            if held[0] == 0:
                self._slots.wait_for(lambda: self._staged_count < self.in_flight_limit)
            self._staged_count += 1
            held[0] += 1
        return held

    def _free_stage_slot(self, held: list[int] | None) -> None:
        if held is None:
            return
        with self._slots:
            self._staged_count -= 1
            held[0] -= 1
            self._slots.notify_all()

    def _h2d(self, dst: Any, src: np.ndarray, st: _Streams) -> None:
        """src -> dst on st.main: straight from page-locked memory, else through the thread's two
        pinned bounce buffers, each filled by parallel host copies while the other one's DMA runs."""
        if src.nbytes == 0:
            return
        if _is_pinned(src):
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, _H2D, st.main.ptr)
            return
        self._ensure_bounce(st, src.nbytes)
        size = int(st.bounce[0].nbytes)
        flat = src.reshape(-1).view(np.uint8)
        for lo in range(0, flat.nbytes, size):
            k = st.turn = st.turn ^ 1  # alternate across arrays too: b fills one buffer while a's DMA runs
            n = min(size, flat.nbytes - lo)
            if st.bounce_events[k] is not None:
                st.bounce_events[k].synchronize()  # that buffer's previous DMA is done
            self._parallel_copy(st.bounce[k][:n], flat[lo : lo + n])
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr + lo, st.bounce[k].ctypes.data, n, _H2D, st.main.ptr)
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(st.main)
            st.bounce_events[k] = ev

    def _ensure_bounce(self, st: _Streams, nbytes: int) -> None:
        """The thread's two pinned bounce buffers, at least min(nbytes, BOUNCE_BYTES) each: sized to
        the partition (a power of two from 1 MiB), so a small proof does not page-lock 128 MiB."""
        want = min(BOUNCE_BYTES, max(MIN_BOUNCE_BYTES, 1 << max(0, nbytes - 1).bit_length()))
        have = int(st.bounce[0].nbytes) if st.bounce else 0
        if have >= min(nbytes, BOUNCE_BYTES):
            return
        for ev in st.bounce_events:
            if ev is not None:
                ev.synchronize()  # the old buffers' last DMA is done before they go back to the pool
        st.bounce = [np.frombuffer(cupy.cuda.alloc_pinned_memory(want), dtype=np.uint8, count=want) for _ in range(2)]
        st.bounce_events = [None, None]
        with self._lock:
            self._pinned_bytes += 2 * (want - have)

    def _parallel_copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        if src.nbytes < PARALLEL_COPY_BYTES:  # a thread hand-off costs more than it saves
            np.copyto(dst, src)
            return
        step = -(-src.nbytes // COPY_THREADS)
        futs = [self._copier.submit(np.copyto, dst[lo : lo + step], src[lo : lo + step])
                for lo in range(0, src.nbytes, step)]
        for f in futs:
            f.result()

    def _context(self, scalars: Any) -> tuple[GpuStaged | None, Any, Any]:
        """(partition, plan, event to wait for) for MSM scalars: the staged w or a row suffix of
        it (w's plan, cut; the staging event), a partition's H values (a dense plan; the H step's
        event), or (None, None, None) for anything else."""
        if not isinstance(scalars, cupy.ndarray) or scalars.ndim != 2 or not scalars.flags.c_contiguous:
            return None, None, None
        ptr = int(scalars.data.ptr)
        with self._lock:
            parts = list(self._parts.values())
        for p in parts:
            if p.h is not None and int(p.h.data.ptr) == ptr and p.h.shape == scalars.shape:
                return p, msm_plan.dense_plan(int(scalars.shape[0])), p.h_ready
            w = p.d.get("w")
            if w is None:
                continue
            lo = int(w.data.ptr)
            k, rem = divmod(ptr - lo, 32)
            if lo <= ptr < lo + int(w.nbytes) + 1 and not rem and k + scalars.shape[0] == w.shape[0]:
                return p, p.plan.tail(k), p.ready
        return None, None, None

    def h_values(self, key: GpuKey, staged: GpuStaged) -> Any:
        """p[j] = (A*B - C)(w_2n^(2j+1)) in standard form, written over the staged a (b and c are
        clobbered); enqueued on this thread's main stream. A partition staged as w alone first gets
        its a, b, c from the witness map there (the ``witness_map`` span)."""
        if not staged.d or staged.h is not None:
            raise InputError("h_values on a released partition, or twice on one")
        self.map_witness(key, staged)
        st = self.streams()
        with cupy.cuda.Device(self.device), st.main:
            st.main.wait_event(staged.ready)
            d = staged.d
            start = _record(st.main)
            p = self.ntt_engine.coset_h_in_place(d["a"], d["b"], d["c"], stream=st.main)
            end = _record(st.main)
            staged.run.events.append(("ntt_h", start, end))
        staged.h, staged.h_ready = p, end
        return p

    def map_witness(self, key: GpuKey, staged: GpuStaged) -> None:
        """a, b, c of a partition staged as w alone (:meth:`stage_witness`), made from w by the
        key's witness map on this thread's main stream (the ``witness_map`` span); nothing for a
        partition that has them. :meth:`h_values` calls it first."""
        if not staged.d:
            raise InputError("map_witness on a released partition")
        if staged.witness_map is None or "a" in staged.d:
            return
        st = self.streams()
        n = int(key.zkey.domain_size)
        with cupy.cuda.Device(self.device), st.main:
            memory.ensure_free(3 * 32 * n, "a partition's a, b, c (the device witness map)")
            st.main.wait_event(staged.ready)
            start = _record(st.main)
            d = staged.d
            d.update({k: cupy.empty((n, 4), dtype=np.uint64) for k in "abc"})
            staged.witness_map.run(d["w"], d["a"], d["b"], d["c"])
            staged.run.events.append(("witness_map", start, _record(st.main)))

    def msm(self, key: GpuKey, section: str, scalars: Any) -> Future:
        """sum_i scalars[i] P_i over key section ``section`` (G2 for "b2"), enqueued; the Future's
        result is an arkworks point. Scalars: a device (or host) ``(n, 4)`` standard-form array
        with exactly the section's point count."""
        return self.msm_batch(key, section, [scalars])[0]

    def msm_batch(self, key: GpuKey, section: str, scalars: Sequence[Any]) -> list[Future]:
        """The MSMs of k scalar vectors over one section; every vector is checked before any is
        enqueued. A key up to :data:`DENSE_KEY_ROWS` whose vectors are all staged partitions' (w, its
        suffix, or H values) runs them as ONE batched pass on the section's stream; otherwise each
        is enqueued on its own (:meth:`_Streams.msm_stream`) with no host wait but the sorts'.
        Futures in order, as :meth:`msm`'s."""
        if section not in SECTIONS:
            raise InputError(f"unknown MSM section {section!r}: expected one of {', '.join(SECTIONS)}")
        if not key.msms:
            raise InputError("msm with a closed key")
        want = key.counts[section]
        for v in scalars:
            got = int(v.shape[0]) if getattr(v, "ndim", 0) == 2 else -1
            if got != want:
                raise InputError(f"MSM {section}: {got} scalars for the section's {want} points"
                                 if got >= 0 else f"MSM {section}: scalars must be an (n, 4) array, got "
                                 f"{getattr(v, 'shape', type(v).__name__)}")
        st = self.streams()
        if batches_msms(int(key.zkey.domain_size), len(scalars), section in key.supports):
            batched = self._enqueue_batch(key.msms[section], section, scalars, st.msm_stream(key, section, 0))
            if batched is not None:
                return batched
        support = key.supports.get(section)
        rows = key.support_rows[support] if support is not None else None
        return [self._enqueue_msm(key.msms[section], section, v, st.msm_stream(key, section, i), support, rows)
                for i, v in enumerate(scalars)]

    def _enqueue_msm(self, m: Any, section: str, scalars: Any, s: Any, support: str | None = None,
                     rows: Any = None) -> Future:
        """One MSM on stream ``s``: a staged partition's scalars take its plan (the whole witness
        over a section packed to a ``support``'s ``rows``: the plan of those rows' scalars, packed
        at staging), any other vector is classified here (packed first for such a section)."""
        with cupy.cuda.Device(self.device), s:
            part, plan, ready = self._context(scalars)  # C's cut of w's plan is enqueued on s
            if part is not None:
                s.wait_event(ready)
            sub = plan.subsets.get(support) if part is not None and support is not None and plan is part.plan \
                else None
            if sub is not None:
                d_scalars, plan = sub.scalars, sub
            elif part is None or rows is not None:  # a vector of no partition, or one not packed at staging
                d_scalars = cupy.ascontiguousarray(cupy.asarray(scalars))
                if rows is not None:
                    d_scalars = d_scalars[rows]
                plan = msm_plan.classify(d_scalars, m.params.nthreads)
            else:
                d_scalars = scalars
            start = _record(s)
            pending = m.launch(d_scalars, plan)
            end = _record(s)
        if part is not None:
            return self._track(part, section, pending, start, end)
        return self._finisher.submit(self._standalone, pending, start, end)

    def _track(self, part: GpuStaged, section: str, pending: Any, start: Any, end: Any) -> Future:
        """Record a partition's enqueued MSM (its span for the timings, its pending result for
        :meth:`release`) and hand its host part to a finisher thread."""
        part.run.events.append((f"msm_{section}", start, end))
        part.run.pending[section] = pending
        return self._finisher.submit(self._finish, pending, part.canonical)

    def _enqueue_batch(self, m: Any, section: str, scalars: Sequence[Any], s: Any) -> list[Future] | None:
        """The k MSMs as one :meth:`.msm._Msm.launch_batch` on ``s`` (after every partition's data
        is ready), or None when some vector is not a staged partition's with a dense plan."""
        with cupy.cuda.Device(self.device), s:
            ctx = [self._context(v) for v in scalars]
            if any(part is None or plan.other is not None for part, plan, _ in ctx):
                return None
            for _, _, ready in ctx:
                s.wait_event(ready)
            start = _record(s)
            pendings = m.launch_batch(list(scalars), [plan for _, plan, _ in ctx])
            end = _record(s)
        return [self._track(part, section, pending, start, end) for (part, _, _), pending in zip(ctx, pendings)]

    @staticmethod
    def _finish(pending: Any, canonical: np.ndarray | None) -> Any:
        """The MSM's point, after the deferred canonical check of a dense plan's witness (its flag
        was copied back before the partition's ready event, which the MSM's stream waited for). In the
        pipeline synthesis has already refused any witness value >= r before it reached a ring slot, so
        this is a second line of defence; where it fires inside a batch the whole pass fails."""
        out = pending.result()
        if canonical is not None and canonical[0]:
            raise InputError(msm_plan.NON_CANONICAL)
        return out

    def _standalone(self, pending: Any, start: Any, end: Any) -> Any:
        out = pending.result()
        end.synchronize()
        self._add_busy(start, 0.0, float(cupy.cuda.get_elapsed_time(start, end)))
        return out

    def _add_busy(self, ref: Any, lo_ms: float, hi_ms: float) -> None:
        """Count ``[lo_ms, hi_ms]`` after the (completed) event ``ref`` as device-busy time, once
        where it overlaps another partition's span. Events are placed on one timeline by chaining:
        each ``ref`` is placed by its distance from the previous one, a short float32 interval
        while the device is busy, so the placement keeps its precision in a prover that runs for
        weeks (one distance from a fixed start would lose milliseconds after a day)."""
        with self._lock:
            if self._clock is None:
                at = 0.0
            else:
                prev, prev_at = self._clock
                at = prev_at + float(cupy.cuda.get_elapsed_time(prev, ref))
            self._clock = (ref, at)
            self._busy.add(at + lo_ms, at + hi_ms)
            self.busy_seconds = self._busy.covered / 1000.0

    def release(self, staged: GpuStaged) -> dict[str, float]:
        """Drop the partition's device buffers (back to CuPy's pool) after its enqueued work is
        done; records its timings as ``last_timings`` and returns them (the spans of its CUDA events,
        ms; empty on a second call). Idempotent."""
        if not staged.d:
            return {}
        spans: dict[str, float] = {}
        with self._lock:
            self._parts.pop(int(staged.d["w"].data.ptr), None)
        run = staged.run
        for p in run.pending.values():
            p.wait_device()  # the device must be done with these buffers before they go
        if run.events:
            for _, _, end in run.events:
                end.synchronize()
            ref = run.events[0][1]
            starts = [float(cupy.cuda.get_elapsed_time(ref, a)) for _, a, _ in run.events]  # signed ms
            ends = [float(cupy.cuda.get_elapsed_time(ref, b)) for _, _, b in run.events]
            spans = {name: float(cupy.cuda.get_elapsed_time(a, b)) for name, a, b in run.events}
            spans["total"] = max(ends) - min(starts)
            spans.update(staged.timings)
            if staged.copy_start is not None:
                spans["h2d"] = float(cupy.cuda.get_elapsed_time(staged.copy_start, staged.ready))
            self.last_timings = spans
            self._add_busy(ref, min(starts), max(ends))
        staged.d = {}
        staged.witness_map = None  # the rows it was mapped with, kept until the device is done with them
        staged.h = None
        staged.plan = None
        staged.run = _Run()
        self._free_stage_slot(staged.holder)
        staged.holder = None
        return spans

    # ---- primitives
    def _upload(self, a: np.ndarray) -> Any:
        arr = np.ascontiguousarray(a, dtype=np.uint64)
        if arr.ndim != 2 or arr.shape[1] != 4:
            raise InputError(f"expected an (n, 4) uint64 Fr array, got {arr.dtype} {arr.shape}")
        memory.ensure_free(arr.nbytes, "an Fr vector")
        return cupy.asarray(arr)

    def ntt(self, values: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Natural-order NTT (or the 1/n-scaled inverse) of a Montgomery Fr vector."""
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            d = self._upload(values)
            self.ntt_engine.ntt_in_place(d, inverse=inverse, stream=s)
            out = cupy.asnumpy(d, stream=s)
            s.synchronize()
            return out

    def coset_h(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Standard-form H scalars: odd-coset values of A*B - C."""
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            da, db, dc = (self._upload(x) for x in (a, b, c))
            self.ntt_engine.coset_h_in_place(da, db, dc, stream=s)
            out = cupy.asnumpy(da, stream=s)
            s.synchronize()
            return out

    def msm_g1(self, points: np.ndarray, scalars: np.ndarray) -> G1Point:
        """G1 MSM over zkey-layout points."""
        with cupy.cuda.Device(self.device), self.stream():
            return gmsm.msm_g1(points, scalars)

    def msm_g2(self, points: np.ndarray, scalars: np.ndarray) -> G2Point:
        """G2 MSM over zkey-layout points."""
        with cupy.cuda.Device(self.device), self.stream():
            return gmsm.msm_g2(points, scalars)

    def fixed_base_g1(self, base: G1Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device), self.stream():
            return fixed_base.fixed_base_g1(base, scalars)

    def fixed_base_g2(self, base: G2Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device), self.stream():
            return fixed_base.fixed_base_g2(base, scalars)

    def close(self) -> None:
        """Stop the helper threads and return CuPy's idle pool blocks to the driver."""
        self._finisher.shutdown(wait=True)
        self._copier.shutdown(wait=True)
        with cupy.cuda.Device(self.device):
            cupy.get_default_memory_pool().free_all_blocks()


def _section_fixed_base(name: str, group: str, scalars: np.ndarray, n: int) -> Any:
    """The fixed-base kernel of section ``name`` (``group`` "g1" or "g2"), its n host scalars checked."""
    if scalars.shape != (n, 4) or scalars.dtype != np.uint64:
        raise InputError(f"generate_key: section {name} scalars {scalars.dtype} {scalars.shape}, "
                         f"expected ({n}, 4) uint64")
    return fixed_base.FixedBase(G2Point() if group == "g2" else G1Point())


def _nonzero_chunks(scalars: np.ndarray, n: int) -> Iterator[tuple[int, Any, Any]]:
    """(first row, device chunk, its rows whose scalar is not 0) of n host scalars, GEN_CHUNK_ROWS at
    a time: a zero scalar's point is the point at infinity (all-zero words, as the zkey stores it)
    and needs no kernel lane, which would cost its warp as much as any other."""
    for lo in range(0, n, GEN_CHUNK_ROWS):
        chunk = cupy.asarray(scalars[lo : min(n, lo + GEN_CHUNK_ROWS)])
        yield lo, chunk, cupy.flatnonzero(chunk.any(axis=1))


def _fixed_base_rows(s: Any, name: str, group: str, scalars: np.ndarray, n: int) -> Any:
    """Section ``name``'s points s_i G (``group`` "g1" or "g2") on the device from its n host scalars,
    done when this returns; only the nonzero rows are run (:func:`_nonzero_chunks`: the B sections of
    a circuit like PoRep's are 0 on most wires, 55 % of the PoRep-like circuit's)."""
    fb = _section_fixed_base(name, group, scalars, n)
    out = cupy.zeros((n, point_words(name)), dtype=np.uint64)
    for lo, chunk, rows in _nonzero_chunks(scalars, n):
        if int(rows.shape[0]) == int(chunk.shape[0]):
            fb.run_device(chunk, out[lo : lo + int(chunk.shape[0])])
        elif int(rows.shape[0]):
            out[lo + rows] = fb.run_device(chunk[rows])
    s.synchronize()
    return out


def _fixed_base_support(s: Any, name: str, group: str, scalars: np.ndarray, n: int) -> tuple[Any, Any]:
    """Section ``name``'s points, packed (:meth:`GpuBackend._pack`'s form) where it is sparse, and
    its rows with a point (those whose scalar is not 0, ascending int32): packed, only those rows'
    points, when they are at most SUPPORT_MAX_FRACTION of the n rows, else the whole section (zero
    rows at infinity). The nonzero scalars are gathered on the device as they are uploaded (n x 32 B
    at most, transient), so the whole section is allocated only where it is kept whole, and the rows
    come without a pass over the points (a 2^27 section's took seconds)."""
    fb = _section_fixed_base(name, group, scalars, n)
    kept = cupy.empty((n, 4), dtype=np.uint64)
    parts, m = [], 0
    for lo, chunk, rows in _nonzero_chunks(scalars, n):
        k = int(rows.shape[0])
        kept[m : m + k] = chunk[rows]
        parts.append((rows + lo).astype(np.int32))
        m += k
    rows = cupy.concatenate(parts) if parts else cupy.zeros(0, dtype=np.int32)
    packed = m <= SUPPORT_MAX_FRACTION * n
    if packed:
        out = cupy.empty((m, point_words(name)), dtype=np.uint64)
    else:
        out = cupy.zeros((n, point_words(name)), dtype=np.uint64)  # rows at infinity between the points
    for lo in range(0, m, GEN_CHUNK_ROWS):
        hi = min(m, lo + GEN_CHUNK_ROWS)
        if packed:
            fb.run_device(kept[lo:hi], out[lo:hi])
        else:
            out[rows[lo:hi]] = fb.run_device(kept[lo:hi])
    s.synchronize()
    return out, rows


def _same_rows(x: Any, y: Any) -> bool:
    """Whether two int32 device row lists are equal, compared on the host: 240 MB each at 2^27, a
    few tens of ms, where ``cupy.array_equal`` compiles two kernels on a machine whose CuPy cache
    has not seen them (seconds, once per machine)."""
    return x.shape == y.shape and bool(np.array_equal(cupy.asnumpy(x), cupy.asnumpy(y)))


def _record(stream: Any) -> Any:
    ev = cupy.cuda.Event()
    ev.record(stream)
    return ev


def _is_pinned(a: np.ndarray) -> bool:
    """Whether a host array lies in page-locked memory (cudaHostAlloc'd or registered)."""
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(int(a.ctypes.data))
    except cupy.cuda.runtime.CUDARuntimeError:
        return False
    return int(getattr(attrs, "type", 0)) == 1  # cudaMemoryTypeHost


def _upload_release(dst: Any, src: np.ndarray, stream: Any, chunk: int = 256 << 20, drop_cache: bool = True) -> int:
    """Copy a host array to the device chunk by chunk (pageable copies: the driver stages them,
    no second host copy of the key) and release each chunk's pages once the copy returned
    (:func:`hostmem.release_pages`: only file-mapped memory; ``drop_cache``: from the page cache
    too); bytes released."""
    flat = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    released = 0
    for lo in range(0, flat.nbytes, chunk):
        part = flat[lo : lo + chunk]
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr + lo, part.ctypes.data, part.nbytes, _H2D, stream.ptr)
        stream.synchronize()
        released += hostmem.release_pages(part, drop_cache)
    return released
