"""A CPU stand-in for CuPy, to run the MSM and fixed-base host code and kernels without a GPU.

Test-only. :func:`load` imports a fresh copy of a ``cuzk_mp.backends.gpu`` module
(``msm``, ``fixed_base``) with ``cupy`` replaced by :data:`fake_cupy` (numpy
arrays play device arrays, streams and events are no-ops: everything runs at
once, in order) and ``get_module`` replaced by :func:`get_module`, which compiles
the kernel file as HOST C++ (``g++``; the field headers' portable carry-chain
fallback) into a shared library and launches kernels by looping over the grid
(``prelude.h``). The host code, the kernel bodies, the include assembly
(:func:`cuzk_mp.backends.gpu.source.assemble`) and the launch arguments are the
real ones; only the parallel execution is serial, so the emulation is valid for
kernels without inter-thread cooperation, and, in modules that use
``__syncthreads``, for block-level cooperation through shared memory (the threads
of a block run as fibers that meet at every barrier). Device-to-host copies, which need a
device pointer, are plain numpy copies here.

``kernels/`` beside this file holds test kernels (``ff/check.cu``, ``ec/check.cu``)
that include the package's headers: :data:`KERNELS` is their ``root``.

Built libraries are cached under the system temp dir by a digest of the
assembled source and the defines.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import numpy as np
import pytest

PRELUDE = Path(__file__).with_name("prelude.h")
KERNELS = Path(__file__).with_name("kernels")
SLOTS = 16  # kernel argument slots of emu_launch (prelude.h)
CACHE = Path(tempfile.gettempdir()) / "cuzk-gpu-emu"
_lock = threading.Lock()
# The two kinds a kernel test runs on: "emu" (this module: host C++, marker slow) and "gpu" (CuPy on a
# device, marker gpu); the ``kind`` fixture below (every test module has it: tests/conftest.py) runs a test on both.
KINDS = [pytest.param("emu", marks=pytest.mark.slow), pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Which implementation runs the kernels."""
    return str(request.param)

_libs: dict[str, ctypes.CDLL] = {}


def available() -> bool:
    """True when a host C++ compiler is there."""
    return shutil.which("g++") is not None


class _Event:
    done = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None


class _Stream:
    ptr = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None


_STREAM = _Stream()


def _elapsed_ms(a: _Event, b: _Event) -> float:
    return (b.t - a.t) * 1e3


fake_cupy = types.SimpleNamespace(
    ndarray=np.ndarray, asarray=np.asarray, asnumpy=np.asarray, ascontiguousarray=np.ascontiguousarray,
    empty=np.empty, zeros=np.zeros, stack=np.stack, flatnonzero=np.flatnonzero, argsort=np.argsort, cumsum=np.cumsum,
    count_nonzero=np.count_nonzero, concatenate=np.concatenate, arange=np.arange, searchsorted=np.searchsorted,
    cuda=types.SimpleNamespace(Event=_Event, Stream=_Stream, get_elapsed_time=_elapsed_ms,
                               get_current_stream=lambda: _STREAM, alloc_pinned_memory=bytearray),
)


def _copy_to_host(d: np.ndarray, host: np.ndarray, stream: Any) -> None:
    np.copyto(host, d)


def _arg(a: Any) -> int:
    if a is None:
        return 0
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise ValueError("emulated kernel argument must be C-contiguous")
        return int(a.ctypes.data)
    return int(a) & ((1 << 64) - 1)


class _Kernel:
    def __init__(self, lib: ctypes.CDLL, name: str, coop: bool) -> None:
        self.lib, self.name = lib, name
        self.fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        self.launch = lib.emu_launch_coop if coop else lib.emu_launch

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **_: Any) -> None:
        if len(args) > SLOTS:
            raise ValueError(f"{self.name}: more than {SLOTS} kernel arguments")
        slots = (ctypes.c_uint64 * SLOTS)(*([_arg(a) for a in args] + [0] * (SLOTS - len(args))))
        self.launch(ctypes.c_void_p(self.fn), ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), slots)


class _Module:
    def __init__(self, lib: ctypes.CDLL, coop: bool) -> None:
        self.lib, self.coop = lib, coop

    def get_function(self, name: str) -> _Kernel:
        return _Kernel(self.lib, name, self.coop)


def get_module(path: str, defines: Mapping[str, Any] | None = None, root: Path | None = None) -> _Module:
    """Host build of ``kernels/<path>`` with the ``-D`` knobs (same signature as modules.get_module)."""
    from cuzk_mp.backends.gpu.source import assemble

    src = assemble(path, root)
    dflags = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted((defines or {}).items())]
    flags = ["-O2", "-std=c++17", "-shared", "-fPIC", "-w"]  # in the digest: a change of them builds anew
    digest = hashlib.sha256((src + " ".join(dflags + flags) + PRELUDE.read_text()).encode()).hexdigest()[:20]
    coop = "__syncthreads" in src  # a module with block-level cooperation: fibers (prelude.h)
    with _lock:
        if digest in _libs:
            return _Module(_libs[digest], coop)
        CACHE.mkdir(parents=True, exist_ok=True)
        so = CACHE / f"{digest}.so"
        if not so.exists():
            cu = CACHE / f"{digest}.cpp"
            cu.write_text(src)
            tmp = CACHE / f"{digest}.{time.time_ns()}.so"
            cmd = ["g++", *flags, "-include", str(PRELUDE), *dflags,
                   str(cu), "-o", str(tmp)]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            tmp.rename(so)
        lib = ctypes.CDLL(str(so))
        for launcher in (lib.emu_launch, lib.emu_launch_coop):
            launcher.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]
        _libs[digest] = lib
        return _Module(lib, coop)


# The modules an MSM module imports that import CuPy themselves: loaded fresh with it, and taken out
# of sys.modules again afterwards.
MSM_FAMILY = ("msm_host", "msm_plan", "msm_passes", "msm_graph")


def load(name: str) -> types.ModuleType:
    """A fresh ``cuzk_mp.backends.gpu.<name>`` bound to the fake CuPy and the host builds.

    sys.modules is restored afterwards, so a real-CuPy import in the same process is
    unaffected.
    """
    full = f"cuzk_mp.backends.gpu.{name}"
    fake_modules = types.ModuleType("cuzk_mp.backends.gpu.modules")
    fake_modules.get_module = get_module  # type: ignore[attr-defined]
    fake_modules.occupancy = lambda kernel, nthreads: None  # type: ignore[attr-defined]
    family = [f"cuzk_mp.backends.gpu.{m}" for m in MSM_FAMILY]
    saved = {k: sys.modules.get(k) for k in ("cupy", "cuzk_mp.backends.gpu.modules", full, *family)}
    try:
        sys.modules["cupy"] = fake_cupy  # type: ignore[assignment]
        sys.modules["cuzk_mp.backends.gpu.modules"] = fake_modules
        for k in (full, *family):
            sys.modules.pop(k, None)
        mod = importlib.import_module(full)
        for k in (full, *family):  # every fresh module that copies results to the host
            fresh = sys.modules.get(k)
            if fresh is not None and hasattr(fresh, "_copy_to_host_async"):
                fresh._copy_to_host_async = _copy_to_host  # type: ignore[attr-defined]
        return mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def module_for(kind: str, name: str) -> types.ModuleType:
    """``cuzk_mp.backends.gpu.<name>`` on the real GPU (``kind="gpu"``) or emulated (``"emu"``).

    Skips the calling test when that kind cannot run here.
    """
    import pytest

    if kind == "emu":
        if not available():
            pytest.skip("no host C++ compiler for the kernel emulator")
        return load(name)
    pytest.importorskip("cupy")
    from cuzk_mp.backends import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device")
    return importlib.import_module(f"cuzk_mp.backends.gpu.{name}")
