"""Loaded CUDA modules: the package's precompiled binaries, NVRTC only where none fits.

:func:`get_module` returns one module per (kernel file, ``-D`` knobs, device):

1. a shipped binary of that variant (``kernels/bin``, built by
   ``scripts/build_kernels.py`` for the architectures of :data:`.knobs.ALL_ARCHS`:
   nvcc 13's fatbin, or on a driver older than CUDA 13 the NVRTC 12.9 cubin,
   :mod:`.bin_sets`), when its manifest entry has machine code this device runs
   (:func:`.knobs.sass_for`) and was built from the sources the package holds now
   (the assembled source's digest matches): loading takes milliseconds, so a fresh
   machine proves without compiling;
2. otherwise NVRTC on the assembled source (CuPy's disk cache keeps the result for
   the next process), after ONE log line per variant saying why no binary served
   (no entry, no code for this architecture, sources changed, or a load error).

Kernel files outside the package (test and benchmark kernels, ``root``) always go
through NVRTC. Within a process modules are cached here, guarded by a lock (GPU
worker threads share them). :func:`warm_up` loads every shipped variant of some
groups before the prover process reports READY, so no proof pays a load.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import cupy

from ...errors import ConfigError
from . import bin_sets, knobs
from .env_knobs import BINARIES_ENV, binaries_mode
from .source import assemble, define_items, kernel_names, module_digest

log = logging.getLogger("cuzk_mp.backends.gpu.modules")

# NVRTC options of every module: -std=c++17 for `static constexpr` members and `if constexpr`.
# The target architecture is added by CuPy (the current device's).
NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)
MANIFEST = "manifest.json"

_lock = threading.Lock()
_cache: dict[tuple[Any, ...], Any] = {}
_origin: dict[tuple[Any, ...], str] = {}  # where each cached module came from (origins())
_warned: set[tuple[Any, ...]] = set()
_manifest_cache: dict[str, Any] | None = None


def device_arch(device: int | None = None) -> str:
    """SASS target of a device as nvcc spells it (``"sm_90"`` on an H200)."""
    dev = cupy.cuda.Device() if device is None else cupy.cuda.Device(device)
    return f"sm_{dev.compute_capability}"


def bin_dir() -> Path:
    """The folder of the shipped binaries and their manifest."""
    return Path(str(resources.files(__package__).joinpath("kernels").joinpath("bin")))


def manifest() -> dict[str, Any]:
    """The shipped binaries' manifest (``{"modules": []}`` when none are installed)."""
    global _manifest_cache
    if _manifest_cache is None:
        path = bin_dir() / MANIFEST
        _manifest_cache = json.loads(path.read_text()) if path.is_file() else {"modules": []}
    return _manifest_cache


def manifest_entry(path: str, defines: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The manifest entry of one variant, or None."""
    want = [list(kv) for kv in define_items(defines)]
    for entry in manifest().get("modules", []):
        if entry["path"] == path and [[k, str(v)] for k, v in entry["defines"]] == want:
            return dict(entry)
    return None


def _shipped_module(path: str, defines: Mapping[str, Any] | None, arch: str) -> tuple[Any, str]:
    """(module, its set and target, e.g. "cuda12 sm_86") from a shipped binary (the set the driver
    reads first, :func:`.bin_sets.load_order`), or (None, why not)."""
    entry = manifest_entry(path, defines)
    if entry is None:
        return None, "no precompiled binary of this variant in the package"
    if entry["source_sha256"] != module_digest(path, defines):
        return None, "the kernel sources changed since the binary was built (run scripts/build_kernels.py)"
    mode = binaries_mode()
    if mode == "nvrtc":
        return None, f"{BINARIES_ENV}=nvrtc"
    whys = []
    for kind in bin_sets.load_order(entry, _driver_version(), mode):
        mod, detail = _load_set(entry, kind, arch)
        if mod is not None:
            return mod, detail
        whys.append(detail)
    return None, "; ".join(whys) or f"no {mode} binary of this variant in the package"


@functools.cache
def _driver_version() -> int:
    """cudaDriverGetVersion (13000 for CUDA 13.0): a process's driver does not change, so asked once."""
    return int(cupy.cuda.runtime.driverGetVersion())


def _load_set(entry: Mapping[str, Any], kind: str, arch: str) -> tuple[Any, str]:
    """(module, "<set> <target>") from one set of an entry's binaries, or (None, why not)."""
    files = entry if kind == bin_sets.FATBIN else entry[kind]
    target = knobs.sass_for(arch, files["archs"])
    if target is None:
        return None, f"the {kind} binary has code for {', '.join(files['archs'])}, none of which runs on {arch}"
    file = bin_dir() / files["file"]
    if not file.is_file():
        return None, f"{file.name} is missing from the package"
    try:
        load = file if kind == bin_sets.FATBIN else bin_sets.cubin_file(bin_sets.read_cubin(file, target))
        mod = cupy.RawModule(path=str(load))
        mod.get_function(entry["kernels"][0])  # loads the module now: errors surface here
    except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
        return None, f"loading {file.name} ({target}) failed ({exc})"
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        return None, f"reading {file.name} ({target}) failed ({exc})"
    return mod, f"{kind} {target}"


def _nvrtc_module(path: str, defines: Mapping[str, Any] | None, root: Path | None) -> Any:
    options = NVRTC_OPTIONS + tuple(f"-D{k}={v}" for k, v in define_items(defines))
    mod = cupy.RawModule(code=assemble(path, root), options=options)
    try:
        mod.compile()
    except cupy.cuda.compiler.CompileException as exc:
        raise ConfigError(f"NVRTC failed on kernels/{path} with {options}:\n{exc}") from exc
    return mod


def get_module(path: str, defines: Mapping[str, Any] | None = None, root: Path | None = None) -> Any:
    """The loaded module (``cupy.RawModule``) of ``kernels/<path>`` with the given ``-D`` knobs.

    ``root``: a folder of test or benchmark kernels searched before the package
    (:func:`.source.assemble`); such modules are compiled with NVRTC.
    """
    arch = device_arch()
    key = (path, define_items(defines), arch, None if root is None else str(root))
    with _lock:
        mod = _cache.get(key)
        if mod is not None:
            return mod
        origin = "NVRTC"
        if root is None:
            mod, detail = _shipped_module(path, defines, arch)
            if mod is not None:
                origin = detail
            elif key not in _warned:
                _warned.add(key)
                log.warning("kernels/%s %s: compiling with NVRTC (%s)", path, dict(define_items(defines)), detail)
        if mod is None:
            mod = _nvrtc_module(path, defines, root)
        _cache[key] = mod
        _origin[key] = origin
        return mod


def origins() -> str:
    """Where this process's modules came from, for a start log line: "8 fatbin sm_90; CUDA driver
    13.0" (a set and the target whose code runs, or NVRTC), counted by origin."""
    with _lock:
        counts = Counter(_origin.values())
    version = _driver_version()
    return (", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "none loaded") + \
        f"; CUDA driver {version // 1000}.{version % 1000 // 10}"


def get_function(path: str, name: str, defines: Mapping[str, Any] | None = None) -> Any:
    """One ``extern "C"`` kernel of a module."""
    return get_module(path, defines).get_function(name)


def warm_up(groups: tuple[str, ...] = ("prover",)) -> dict[str, float]:
    """Load (or compile) every shipped variant of ``groups``; seconds each, by label."""
    took = {}
    for v in knobs.variants(groups):
        t0 = time.perf_counter()
        get_module(v.path, v.define_dict)
        label = v.path if not v.defines else f"{v.path} {v.define_dict}"
        took[label] = time.perf_counter() - t0
    return took


def occupancy(kernel: Any, nthreads: int) -> int:
    """Threads of ``kernel`` (a RawKernel) resident at once on the current device:
    blocks per SM for ``nthreads``-thread blocks (the driver's occupancy calculator on
    the kernel's CUfunction handle) x SMs x ``nthreads``."""
    fn_ptr = kernel.kernel.ptr  # RawKernel.kernel: the loaded cupy.cuda.function.Function
    blocks = int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn_ptr, nthreads, 0))
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    return blocks * sms * nthreads


__all__ = [
    "bin_dir",
    "device_arch",
    "get_function",
    "get_module",
    "kernel_names",
    "manifest",
    "manifest_entry",
    "occupancy",
    "origins",
    "warm_up",
]
