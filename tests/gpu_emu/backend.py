"""The GPU backend's host code on the CPU: ``GpuBackend`` over a fake CuPy and the kernel emulator.

Test-only. :func:`load_backend` imports fresh copies of ``cuzk_mp.backends.gpu``'s
``memory``, ``fixed_base``, ``msm`` (with its ``msm_*`` modules), ``ntt``, ``witness_map`` and
``backend`` (with the modules of its parts: ``backend_state``, ``device_limits``, ``key_load``,
``key_generate``, ``staging``, ``proving``) modules bound to a fake CuPy whose "device arrays"
are numpy arrays with a ``data.ptr`` (so the backend's pointer bookkeeping, row slices included,
runs as on the device), whose copies are ``memmove``, and whose streams and events run everything
at once, in order. The MSM and fixed-base kernels are the real ones compiled as host C++ (:mod:`tests.gpu_emu`);
the NTT kernels cooperate through shared memory, which the emulator cannot run, so
the H step is the CPU oracle's (:func:`cuzk_mp.algebra.ntt.coset_h`), written over
the staged ``a`` as the device version does. sys.modules is restored afterwards, so
a real-CuPy import in the same process is unaffected.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import types
from typing import Any

import numpy as np

from . import _Event, _Stream, get_module

GPU = "cuzk_mp.backends.gpu"
# import order: dependencies first
MODULES = ("memory", "fixed_base", "msm_host", "msm_plan", "msm_passes", "msm_graph", "msm", "ntt", "witness_map",
           "backend_state", "device_limits", "key_load", "key_generate", "staging", "proving", "backend")


class DevArray(np.ndarray):
    """A numpy array that answers ``.data.ptr`` as a CuPy array does (views keep the type)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(ptr=int(self.ctypes.data))


def _dev(a: Any) -> DevArray:
    return np.asarray(a).view(DevArray)


def _wrap(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return out.view(DevArray) if isinstance(out, np.ndarray) else out
    return call


class OutOfMemoryError(Exception):
    """cupy.cuda.memory.OutOfMemoryError's stand-in."""


class _Pool:
    mallocs: list[int] = []  # every block asked of the pool (memory.grow_pool), in bytes

    def free_bytes(self) -> int:
        return 0

    def malloc(self, nbytes: int) -> object:
        if nbytes > FREE_BYTES:
            raise OutOfMemoryError(f"out of memory allocating {nbytes} bytes")
        _Pool.mallocs.append(nbytes)
        return object()

    def free_all_blocks(self) -> None:
        return None


class _Device:
    id = 0
    compute_capability = "90"

    def __init__(self, device: int | None = None) -> None:
        self.id = device or 0

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        return None


class CUDARuntimeError(RuntimeError):
    """Stands in for cupy.cuda.runtime.CUDARuntimeError."""


def _memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    ctypes.memmove(dst, src, nbytes)


def _pointer_attributes(ptr: int) -> Any:
    raise CUDARuntimeError("not device memory")  # every host array is pageable here


FREE_BYTES = 8 << 30


def fake_cupy() -> types.SimpleNamespace:
    """The CuPy subset the backend, msm, fixed_base and memory modules use."""
    runtime = types.SimpleNamespace(memcpyAsync=_memcpy_async, pointerGetAttributes=_pointer_attributes,
                                    memGetInfo=lambda: (FREE_BYTES, 2 * FREE_BYTES), CUDARuntimeError=CUDARuntimeError)
    cuda = types.SimpleNamespace(Event=_Event, Stream=_Stream, Device=_Device, runtime=runtime,
                                 get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
                                 get_current_stream=lambda: _Stream(), alloc_pinned_memory=bytearray,
                                 memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError))
    ns = types.SimpleNamespace(ndarray=DevArray, cuda=cuda, get_default_memory_pool=_Pool, asnumpy=np.array)
    for name in ("asarray", "ascontiguousarray", "empty", "zeros", "stack", "flatnonzero", "argsort",
                 "concatenate", "arange", "searchsorted", "array_equal", "cumsum"):
        setattr(ns, name, _wrap(getattr(np, name)))
    ns.count_nonzero = np.count_nonzero
    return ns


class CpuNtt:
    """GpuNtt's interface with the CPU oracle's H step (the NTT kernels cannot be emulated). Its
    tables are counted, not made: the sizes planned, kept until released as GpuNtt keeps them, each
    :func:`~cuzk_mp.backends.gpu.plan.ntt_table_bytes` of the fake device (:func:`fake_device`)."""

    def __init__(self) -> None:
        self._sizes: set[int] = set()

    def plan(self, lg: int) -> None:
        self._sizes.add(1 << lg)

    def domain_sizes(self) -> list[int]:
        return sorted(self._sizes)

    def release(self, domain_size: int) -> None:
        self._sizes.discard(domain_size)

    def coset_h_in_place(self, d_a: Any, d_b: Any, d_c: Any, stream: Any = None) -> Any:
        from cuzk_mp.algebra.ntt import coset_h

        self.plan(int(d_a.shape[0]).bit_length() - 1)
        d_a[...] = coset_h(np.array(d_a), np.array(d_b), np.array(d_c))
        return d_a


def fake_device(monkeypatch: Any, module: types.ModuleType, backend: Any, size: int) -> None:
    """Make the emulated device of ``module`` (a :func:`load_backend`) ``size`` bytes, of which what
    ``backend`` holds is in use (its keys' points, multiples and witness maps as its stats say, its
    staged partitions and its NTT engine's tables): free memory then drops as keys load and rises as
    they close, as a device's does, where :data:`FREE_BYTES` stays."""
    from cuzk_mp.backends.gpu.plan import ntt_table_bytes

    def used() -> int:
        held = backend.stats()
        staged = sum(p.nbytes for p in backend._parts.values())
        tables = sum(ntt_table_bytes(n) for n in backend.ntt_engine.domain_sizes())
        return int(held["device_key_bytes"] + held["device_witness_map_bytes"]) + staged + tables

    monkeypatch.setattr(module.memory.cupy.cuda.runtime, "memGetInfo", lambda: (size - used(), size))


def load_backend() -> types.ModuleType:
    """A fresh ``cuzk_mp.backends.gpu.backend`` on the fake CuPy, the emulated kernels and the
    CPU H step (:class:`CpuNtt`)."""
    fake_modules = types.ModuleType(f"{GPU}.modules")
    fake_modules.get_module = get_module  # type: ignore[attr-defined]
    fake_modules.get_function = lambda path, name, defines=None: get_module(path, defines).get_function(name)  # type: ignore[attr-defined]
    fake_modules.occupancy = lambda kernel, nthreads: None  # type: ignore[attr-defined]
    names = ["cupy", f"{GPU}.modules", *(f"{GPU}.{m}" for m in MODULES)]
    saved = {k: sys.modules.get(k) for k in names}
    try:
        sys.modules["cupy"] = fake_cupy()  # type: ignore[assignment]
        sys.modules[f"{GPU}.modules"] = fake_modules
        for m in MODULES:
            sys.modules.pop(f"{GPU}.{m}", None)
        # each imported here, in order: a module's ``from . import x`` reads the package's attribute x,
        # which an earlier load (or tests.gpu_emu.load) left on a copy no longer in sys.modules
        fresh = {m: importlib.import_module(f"{GPU}.{m}") for m in MODULES}
        for name in ("msm", "msm_plan"):  # the modules that copy results to the host
            fresh[name]._copy_to_host_async = lambda d, host, stream: np.copyto(host, d)  # type: ignore[attr-defined]
        fresh["backend_state"].GpuNtt = CpuNtt  # type: ignore[attr-defined]  # GpuBackend.__init__ makes it
        return fresh["backend"]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
