"""GpuBackend: the Backend Protocol on one CUDA device (NTT/H here, MSMs from msm.py).

Device state it owns: the key's point sections (zkey sections 5..9 uploaded as
is, wrapped in helper B's resident ``MsmG1``/``MsmG2``), the NTT tables
(:class:`.ntt.GpuNtt`), one CUDA stream per calling thread, and each staged
partition's a, b, c, w buffers until :meth:`GpuBackend.release`.

Concurrency contract (DESIGN.md section 1): :meth:`stage` runs on the calling
thread's own stream, so one partition's upload overlaps another's compute;
:meth:`prove_msms` must be serialised per device by the caller (a per-device
lock held around it) - the backend adds no lock of its own there.

Timings: ``last_timings`` holds ms per stage of the last stage()/prove_msms()
(h2d, ntt_h, msm_a, msm_b1, msm_b2, msm_c, msm_h, total) from CUDA events;
``busy_seconds`` accumulates event-timed device work (the pipeline's
GPU-busy fraction).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ...errors import ConfigError, InputError
from ...formats.zkey import ZKey
from ..base import MsmSums, ProverInputs
from . import memory
from .ntt import GpuNtt

_H2D = 1  # cudaMemcpyHostToDevice


def _msm_module() -> Any:
    try:
        from . import msm
    except ImportError as exc:  # helper B's module not present in this checkout
        raise ConfigError(f"GPU MSMs unavailable: cuzk_mp.backends.gpu.msm cannot be imported ({exc})") from exc
    return msm


@dataclass
class GpuKey:
    """A zkey made resident: one MSM object per point section."""

    zkey: ZKey
    msms: dict[str, Any]
    nbytes: int

    def close(self) -> None:
        """Free the device copies of the points (idempotent)."""
        for m in self.msms.values():
            m.close()
        self.msms = {}
        self.nbytes = 0


@dataclass
class GpuStaged:
    """One partition on the device: a, b, c (Montgomery) and w (standard)."""

    device: int
    stream: Any
    d: dict[str, Any]
    nbytes: int
    timings: dict[str, float] = field(default_factory=dict)


class _Events:
    """Named CUDA events on one stream; elapsed ms between marks."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.marks: list[tuple[str, Any]] = []

    def mark(self, name: str) -> None:
        ev = cupy.cuda.Event()
        ev.record(self.stream)
        self.marks.append((name, ev))

    def spans(self) -> dict[str, float]:
        """ms from each mark to the next, keyed by the later mark's name, plus 'total'."""
        self.marks[-1][1].synchronize()
        out = {name: cupy.cuda.get_elapsed_time(a, b) for (_, a), (name, b) in zip(self.marks, self.marks[1:])}
        out["total"] = cupy.cuda.get_elapsed_time(self.marks[0][1], self.marks[-1][1])
        return out


class GpuBackend:
    """The Backend Protocol on CUDA device ``device`` (see the module docstring)."""

    name = "gpu"

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self._local = threading.local()
        self._busy_lock = threading.Lock()
        self.last_timings: dict[str, float] = {}
        self.busy_seconds = 0.0
        with cupy.cuda.Device(device):
            self.ntt_engine = GpuNtt()

    # ---- plumbing
    def stream(self) -> Any:
        """The calling thread's own non-blocking stream on this device."""
        s = getattr(self._local, "stream", None)
        if s is None:
            with cupy.cuda.Device(self.device):
                s = cupy.cuda.Stream(non_blocking=True)
            self._local.stream = s
        return s

    def _add_busy(self, ms: float) -> None:
        with self._busy_lock:
            self.busy_seconds += ms / 1000.0

    # ---- keys and partitions
    def load_key(self, zkey: ZKey) -> GpuKey:
        """Upload sections 5..9 (A, B1, B2, C, H) and build the resident MSM objects."""
        msm = _msm_module()
        sections = {"a": zkey.a, "b1": zkey.b1, "b2": zkey.b2, "c": zkey.c, "h": zkey.h}
        need = sum(int(np.asarray(v).nbytes) for v in sections.values())
        with cupy.cuda.Device(self.device):
            memory.ensure_free(need, f"the proving key {zkey.path or ''} (sections 5..9)")
            msms: dict[str, Any] = {}
            try:
                for name, pts in sections.items():
                    d_pts = cupy.asarray(np.ascontiguousarray(pts))
                    msms[name] = (msm.MsmG2 if name == "b2" else msm.MsmG1)(d_pts)
            except BaseException:
                for m in msms.values():
                    m.close()
                raise
            return GpuKey(zkey, msms, sum(int(m.nbytes) for m in msms.values()))

    def stage(self, key: GpuKey, inputs: ProverInputs) -> GpuStaged:
        """Copy a, b, c, w to the device on this thread's stream; returns once the copy is done."""
        z = key.zkey
        shapes = {"a": (z.domain_size, 4), "b": (z.domain_size, 4), "c": (z.domain_size, 4), "w": (z.n_vars, 4)}
        host = {k: np.ascontiguousarray(getattr(inputs, k), dtype=np.uint64) for k in shapes}
        for k, shape in shapes.items():
            if host[k].shape != shape:
                raise InputError(f"partition vector {k} has shape {host[k].shape}, the key expects {shape}")
        stream = self.stream()
        with cupy.cuda.Device(self.device):
            memory.ensure_free(inputs.nbytes, "staging a partition (a, b, c, w)")
            with memory.PinnedRanges(list(host.values())):
                ev = _Events(stream)
                ev.mark("start")
                d = {k: cupy.empty(v.shape, dtype=np.uint64) for k, v in host.items()}
                for k, v in host.items():
                    cupy.cuda.runtime.memcpyAsync(d[k].data.ptr, v.ctypes.data, v.nbytes, _H2D, stream.ptr)
                ev.mark("h2d")
                timings = ev.spans()  # synchronizes: the host buffers may go after this
        self.last_timings = {"h2d": timings["h2d"]}
        return GpuStaged(self.device, stream, d, sum(int(a.nbytes) for a in d.values()), dict(self.last_timings))

    def prove_msms(self, key: GpuKey, staged: GpuStaged) -> MsmSums:
        """H (3 iNTT, coset scaling, 3 NTT, a*b - c) then the five MSMs; caller holds the device lock."""
        if not staged.d:
            raise InputError("prove_msms on a released partition")
        if not key.msms:
            raise InputError("prove_msms with a closed key")
        d, s, n_pub = staged.d, staged.stream, key.zkey.n_public
        with cupy.cuda.Device(self.device):
            ev = _Events(s)
            ev.mark("start")
            d_p = self.ntt_engine.coset_h_in_place(d["a"], d["b"], d["c"], stream=s)
            ev.mark("ntt_h")
            out = {}
            for name, scalars in (("h", d_p), ("a", d["w"]), ("b1", d["w"]), ("b2", d["w"]),
                                  ("c", d["w"][n_pub + 1 :])):
                out[name] = key.msms[name].run(scalars, stream=s)
                ev.mark(f"msm_{name}")
            spans = ev.spans()
        spans["h2d"] = staged.timings.get("h2d", 0.0)
        self.last_timings = spans
        self._add_busy(spans["total"])
        return MsmSums(a=out["a"], b1=out["b1"], b2=out["b2"], c=out["c"], h=out["h"])

    def release(self, staged: GpuStaged) -> None:
        """Drop the partition's device buffers (they return to CuPy's pool); idempotent."""
        staged.d = {}

    # ---- primitives
    def _upload(self, a: np.ndarray) -> Any:
        arr = np.ascontiguousarray(a, dtype=np.uint64)
        if arr.ndim != 2 or arr.shape[1] != 4:
            raise InputError(f"expected an (n, 4) uint64 Fr array, got {arr.dtype} {arr.shape}")
        memory.ensure_free(arr.nbytes, "an Fr vector")
        return cupy.asarray(arr)

    def ntt(self, values: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Natural-order NTT (or the 1/n-scaled inverse) of a Montgomery Fr vector."""
        with cupy.cuda.Device(self.device):
            d = self._upload(values)
            self.ntt_engine.ntt_in_place(d, inverse=inverse, stream=self.stream())
            self.stream().synchronize()
            return cupy.asnumpy(d)

    def coset_h(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Standard-form H scalars: odd-coset values of A*B - C."""
        with cupy.cuda.Device(self.device):
            da, db, dc = (self._upload(x) for x in (a, b, c))
            self.ntt_engine.coset_h_in_place(da, db, dc, stream=self.stream())
            self.stream().synchronize()
            return cupy.asnumpy(da)

    def msm_g1(self, points: np.ndarray, scalars: np.ndarray) -> G1Point:
        """G1 MSM over zkey-layout points (helper B's kernels)."""
        with cupy.cuda.Device(self.device):
            return _msm_module().msm_g1(points, scalars)

    def msm_g2(self, points: np.ndarray, scalars: np.ndarray) -> G2Point:
        """G2 MSM over zkey-layout points (helper B's kernels)."""
        with cupy.cuda.Device(self.device):
            return _msm_module().msm_g2(points, scalars)

    def fixed_base_g1(self, base: G1Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (helper B's batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device):
            return _fixed_base_module().fixed_base_g1(base, scalars)

    def fixed_base_g2(self, base: G2Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (helper B's batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device):
            return _fixed_base_module().fixed_base_g2(base, scalars)

    def close(self) -> None:
        """Return CuPy's idle pool blocks to the driver."""
        with cupy.cuda.Device(self.device):
            cupy.get_default_memory_pool().free_all_blocks()


def _fixed_base_module() -> Any:
    try:
        from . import fixed_base
    except ImportError as exc:
        raise ConfigError(f"GPU fixed-base unavailable: cuzk_mp.backends.gpu.fixed_base cannot be imported ({exc})") from exc
    return fixed_base
