"""Compiled CUDA modules: one ``cupy.RawModule`` per (kernel file, defines, device arch).

:func:`get_module` assembles ``kernels/<path>`` into a single source string
(:mod:`.source`), appends the knob defines as ``-D`` options and compiles it
through NVRTC. CuPy picks the target itself (``-arch=sm_XY`` of the current
device when NVRTC supports it, so a cubin with Hopper SASS on the H200) and keeps
the cubin in its disk cache keyed by source + options + NVRTC version + arch: a
second process, or a daemon restart, loads it in milliseconds. Within a process
modules are cached here, guarded by a lock (GPU worker threads share them).

:func:`warm_up` compiles every module of :data:`MODULES` with its default knobs:
the GPU process calls it before it reports READY.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import cupy

from ...errors import ConfigError
from .source import assemble

# Options for every module. -std=c++17 for `static constexpr` members and `if
# constexpr`; --device-int128 lets a kernel use unsigned __int128 (the 64-bit-limb
# baseline of the field benchmark). The target arch is added by CuPy.
BASE_OPTIONS: tuple[str, ...] = ("-std=c++17", "--device-int128")

# Every translation unit the package ships, compiled by warm_up().
MODULES: tuple[str, ...] = ("ntt/ntt.cu", "h/h.cu")

_lock = threading.Lock()
_cache: dict[tuple[str, tuple[tuple[str, str], ...], str], Any] = {}


def device_arch(device: int | None = None) -> str:
    """Compute capability of a device as CuPy spells it (``"90"`` on an H200)."""
    dev = cupy.cuda.Device() if device is None else cupy.cuda.Device(device)
    return str(dev.compute_capability)


def _define_options(defines: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    if not defines:
        return ()
    items = []
    for key, val in sorted(defines.items()):
        if not key.isidentifier():
            raise ConfigError(f"bad CUDA define name {key!r}")
        items.append((key, str(int(val)) if isinstance(val, bool) else str(val)))
    return tuple(items)


def get_module(path: str, defines: Mapping[str, Any] | None = None) -> Any:
    """The compiled ``cupy.RawModule`` for ``kernels/<path>`` with the given ``-D`` knobs."""
    dkey = _define_options(defines)
    key = (path, dkey, device_arch())
    with _lock:
        mod = _cache.get(key)
        if mod is not None:
            return mod
        options = BASE_OPTIONS + tuple(f"-D{k}={v}" for k, v in dkey)
        mod = cupy.RawModule(code=assemble(path), options=options)
        try:
            mod.compile()
        except cupy.cuda.compiler.CompileException as exc:
            raise ConfigError(f"NVRTC failed on kernels/{path} with {options}:\n{exc}") from exc
        _cache[key] = mod
        return mod


def get_function(path: str, name: str, defines: Mapping[str, Any] | None = None) -> Any:
    """One ``extern "C"`` kernel of a module."""
    return get_module(path, defines).get_function(name)


def warm_up(paths: tuple[str, ...] = MODULES) -> dict[str, float]:
    """Compile (or load from CuPy's disk cache) every module; seconds per module."""
    took = {}
    for path in paths:
        t0 = time.perf_counter()
        get_module(path)
        took[path] = time.perf_counter() - t0
    return took
