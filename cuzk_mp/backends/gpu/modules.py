"""Compiled CUDA modules: one ``cupy.RawModule`` per (kernel file, defines, device arch).

:func:`get_module` assembles ``kernels/<path>`` into a single source string
(:mod:`.source`), appends the knob defines as ``-D`` options and compiles it
through NVRTC. CuPy picks the target itself (``-arch=sm_XY`` of the current
device when NVRTC supports it, so a cubin with Hopper SASS on the H200) and keeps
the cubin in its disk cache keyed by source + options + NVRTC version + arch: a
second process, or a daemon restart, loads it in milliseconds. Within a process
modules are cached here, guarded by a lock (GPU worker threads share them).

:func:`warm_up` compiles every registered module variant (:func:`register`; the
prover's own modules register themselves on import) before the GPU process
reports READY, so no proof pays a compile.
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

# The prover's translation units (default knobs); others add theirs with register().
MODULES: tuple[str, ...] = ("ntt/ntt.cu", "h/h.cu")
# Host modules whose import registers more module variants (helper B's MSM and fixed-base).
_REGISTERING_IMPORTS = ("msm", "fixed_base")

_lock = threading.Lock()
_cache: dict[tuple[str, tuple[tuple[str, str], ...], str], Any] = {}
_registry: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Mapping[str, Any] | None, str]] = {}


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


def register(path: str, defines: Mapping[str, Any] | None = None, *, group: str = "prover") -> None:
    """Add a (module, knobs) variant to what :func:`warm_up` compiles for ``group``.

    Groups keep start-up honest: a prover process warms only the "prover"
    modules; the dev setup's fixed-base kernels ("setup") compile when setup runs.
    """
    with _lock:
        _registry[(path, _define_options(defines))] = (defines, group)


def warm_up(paths: tuple[str, ...] = MODULES, groups: tuple[str, ...] = ("prover",)) -> dict[str, float]:
    """Compile (or load from CuPy's disk cache) ``paths`` and the registered variants of ``groups``; s each."""
    import importlib

    for name in _REGISTERING_IMPORTS:
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ImportError:
            continue  # not in this checkout: nothing of it to warm
    with _lock:
        variants = [(p, None) for p in paths] + [(p, d) for (p, _), (d, g) in _registry.items() if g in groups]
    took = {}
    for path, defines in variants:
        t0 = time.perf_counter()
        get_module(path, defines)
        label = path if not defines else f"{path} {dict(_define_options(defines))}"
        took[label] = time.perf_counter() - t0
    return took
