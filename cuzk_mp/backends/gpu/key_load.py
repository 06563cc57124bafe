"""Making a key file resident on a GpuBackend: its device plan, upload, packing, multiples and MSMs.

Why a module of its own: a key's residence is the backend's largest single piece of work and its
only one that plans. :class:`_KeyLoading` uploads sections 5..9 from the key file's mapping
(:meth:`~_KeyLoading.load_key`), and for every key made resident (also by
:mod:`.key_generate`) plans its device memory beside the resident keys (:mod:`.device_limits`),
packs its sparse whole-witness sections to their support (:data:`SUPPORT_SECTIONS`), makes its
precomputed multiples, its MSM objects and its domain's NTT tables, and registers it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import cupy
import numpy as np

from ...errors import DeviceMemoryError, InputError, ResourceError
from ...formats.zkey import ZKey
from ..base import WitnessRows
from . import fixed_base, hostmem, memory
from . import msm as gmsm
from . import msm_plan
from .backend_state import _H2D, GpuKey
from .device_limits import _DeviceLimits
from .knobs import FixedBaseParams
from .msm_geometry import DENSE_KEY_ROWS, MULTIPLES_ENV, SECTIONS
from .msm_params import graph_params_for, msm_params_for
from .plan import DevicePlan, KeyShape, plan_device, point_words
from .witness_map import DeviceWitnessMap, LongRows, matrices_bytes

log = logging.getLogger("cuzk_mp.backends.gpu.backend")  # the backend's logger: its lines keep their name

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


class _KeyLoading(_DeviceLimits):
    """Keys made resident on a GpuBackend (a base of :class:`.backend.GpuBackend`)."""

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
        (:meth:`stage_witness`), the very object they will be staged with: the plan counts their
        device copy and the key makes it beside the upload (its first partition would make it
        otherwise: ~8 ms of a one-shot 2^16 prove on an H100). ``batch``: the
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

        return self._resident(zkey, lasting, upload, lambda: released, witness_rows, batch=batch,
                              make_map=witness_rows is not None)

    def _resident(self, zkey: ZKey, lasting: bool, fill: Callable[[Any], dict[str, Any]],
                  released: Callable[[], int], witness_rows: WitnessRows | None = None,
                  known: dict[str, Any] | None = None, batch: int = 1, make_map: bool = False) -> GpuKey:
        """Plan (with the device witness map's rows of ``witness_rows``: copied beside the sections
        where ``make_map``, else by the key's first partition), then ``fill(stream)`` -> the
        sections' device arrays (``known``, filled by ``fill``: name -> the int32 rows with a point
        of the sections it made, packed or whole, as :meth:`_pack` takes them), then the MSM objects
        and the NTT tables; the key registered with its in-flight limit and its batch (``batch``
        partitions asked)."""
        shape = KeyShape.of(zkey)
        sizes = shape.section_bytes()
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            choice = os.environ.get(MULTIPLES_ENV, "").strip() or ("auto" if lasting else "none")
            long = None if witness_rows is None else LongRows.of(witness_rows.a, witness_rows.b)
            wmap = 0 if witness_rows is None else matrices_bytes(witness_rows.a, witness_rows.b,
                                                                  witness_rows.table_mont, witness_rows.table_r2, long)
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
            n = int(zkey.domain_size)
            pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="cuzk-key-kernels")
            early: list[Any] = []
            rows_copy: Future[DeviceWitnessMap] | None = None
            try:
                # What the key needs besides its points, made while they upload: its MSM modules' kernels
                # (CUDA loads a function as it is first asked for: ~8 ms a module) and the H step's NTT
                # tables (~7 ms at 2^16). Made after the sections, they were two thirds of a one-shot
                # prove's key load (2^16 on an H100: 23 of 36 ms). And where asked, the witness map's
                # coded rows (a one-shot's first stage step made them: ~5 ms at 2^16).
                if make_map and witness_rows is not None:
                    rows_copy = pool.submit(self._on_device, DeviceWitnessMap.of_rows, witness_rows, n, long)
                if not lasting:  # and the memory pool its one proof's buffers come from (memory.grow_pool)
                    early.append(pool.submit(self._on_device, memory.grow_pool, dplan.in_flight_total))
                for params, g2 in _msm_variants(dplan, shape):
                    early.append(pool.submit(self._on_device, gmsm.load_kernels, params, g2))
                if n >= 2 and n & (n - 1) == 0:
                    early.append(pool.submit(self._on_device, self.ntt_engine.plan, n.bit_length() - 1))
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
                # A key for one proof keeps the small MSMs' CUDA graphs too: its proof's device step is no
                # longer for their capture (2^16 on an H100: 22-28 ms with them, 23-25 without), and whole
                # one-shots were no faster without them (perf/results/oneshot-first-proof-steps-h100-2026-12-07.json).
                for name in SECTIONS:
                    cls = gmsm.MsmG2 if name == "b2" else gmsm.MsmG1
                    params = dplan.msm_params(msm_params_for(int(dev[name].shape[0])))
                    msms[name] = cls(dev[name], replace(params, graphs=params.graphs and dplan.graphs),
                                     tables.get(name))
                t_msms = time.perf_counter()
                for f in early:  # the NTT tables before any partition; a failure raised here
                    f.result()
                made_map = rows_copy.result() if rows_copy is not None else None
                s.synchronize()
                t_end = time.perf_counter()
                log.info("key %s resident in %.3f s: sections %.3f s, packing %.3f s, plan, multiples and MSM "
                         "objects %.3f s, then what was made beside them (kernels, NTT tables%s) %.3f s",
                         zkey.path or "", t_end - t0, t_fill - t0, t_pack - t_fill, t_msms - t_pack,
                         ", the witness map's rows" if rows_copy is not None else "", t_end - t_msms)
            except BaseException:
                for f in early:
                    f.cancel()
                for m in msms.values():
                    m.close()
                if rows_copy is not None and not rows_copy.cancel() and rows_copy.exception() is None:
                    rows_copy.result().close()
                raise
            finally:
                pool.shutdown(wait=True)
        key = GpuKey(zkey, msms, shape.rows(), points, sum(int(m.nbytes) for m in msms.values()) - points,
                     released(), {n: t.c for n, t in tables.items()}, dplan, supports=supports, support_rows=rows,
                     on_close=self._key_closed)
        if made_map is not None:
            key.witness_map = (witness_rows, made_map)
        with self._lock:
            self._keys = [k for k in self._keys if k.msms] + [key]
        self._set_limits()
        if lasting:  # a key for one proof: nobody reads the figure, and smaps costs a one-shot prove ~20 ms
            self.refresh_host_stats()
        return key

    def _on_device(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with this backend's device current (on a helper thread)."""
        with cupy.cuda.Device(self.device):
            return fn(*args)

    @staticmethod
    def _pack(dev: dict[str, Any], domain_size: int, path: str, n_rows: dict[str, int],
              known: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        """Pack the key's sparse whole-witness sections in ``dev`` (keys above DENSE_KEY_ROWS):
        the first of :data:`SUPPORT_SECTIONS` with at most :data:`SUPPORT_MAX_FRACTION` of its rows
        not at infinity gives the support's rows, the others that have exactly those rows join it
        (and share their plan's sorts), and each such section keeps only those rows' points.
        ``known``: the rows with a point of sections whose makers know them (:func:`.key_generate._fixed_base_support`),
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


def _msm_variants(dplan: DevicePlan, shape: KeyShape) -> list[tuple[Any, bool]]:
    """The (MsmParams, g2) of the key's MSM modules, one per module, as :meth:`_KeyLoading._resident`
    gives them to its MSM objects, from the sections' rows before any packing (where packing moves a
    section to another module, its MSM object loads that module's kernels itself, as it always did)."""
    out: dict[tuple[Any, ...], tuple[Any, bool]] = {}
    for name, n_rows in shape.rows().items():
        g2 = name == "b2"
        params = dplan.msm_params(msm_params_for(n_rows))
        out.setdefault((g2, *sorted(params.defines(g2).items())), (params, g2))
    return list(out.values())


def _same_rows(x: Any, y: Any) -> bool:
    """Whether two int32 device row lists are equal, compared on the host: 240 MB each at 2^27, a
    few tens of ms, where ``cupy.array_equal`` compiles two kernels on a machine whose CuPy cache
    has not seen them (seconds, once per machine)."""
    return x.shape == y.shape and bool(np.array_equal(cupy.asnumpy(x), cupy.asnumpy(y)))


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
