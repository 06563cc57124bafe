"""numba's decorators for the project's kernels, and a log line when numba compiles one.

Every module with numba kernels takes ``njit`` and ``prange`` from here. numba compiles a kernel
at its first call and keeps the machine code on disk (``cache=True``), so only a machine's first
run of each kernel pays, and it pays in silence: on a 2-core VM the first CPU proof of a 2^16 key
took 40-54 s where the next one took 4.3 s, and the first GPU one-shot on a machine spends ~6 s
there on the kernels that build a key's circuit data (`perf/results/witness-map-compile-cpu-2026-12-07.json`).
Importing this module registers a listener on numba's ``numba:compile`` event, which numba
broadcasts only where it found no cached code, so that wait is in the log: a process's first
compilation at INFO (it happens once a machine; ``scripts/warm_caches.py`` does it at install),
every kernel and its time at DEBUG, and the count so far at INFO every :data:`PROGRESS_S` seconds
while compiling goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from numba import njit, prange
from numba.core import event

__all__ = ["njit", "prange", "compile_log"]

log = logging.getLogger(__name__)

PROGRESS_S = 10.0  # seconds between INFO lines while kernels compile


class CompileLog(event.Listener):  # type: ignore[misc]
    """Counts and logs numba's compilations in this process (the outermost ones: a kernel's
    callees compile inside its event and are part of its time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: nesting depth, start of the outermost compile
        self.compiled = 0
        self.seconds = 0.0
        self._last_info: float | None = None

    def on_start(self, ev: Any) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        now = self._local.t0 = time.monotonic()
        with self._lock:
            first = self._last_info is None
            if first:
                self._last_info = now
        if first:
            log.info("compiling %s with numba: its machine code is not in numba's disk cache (it is kept there "
                     "for later processes; scripts/warm_caches.py compiles the kernels at install)", _name(ev))
        else:
            log.debug("compiling %s with numba", _name(ev))

    def on_end(self, ev: Any) -> None:
        depth = self._local.depth = getattr(self._local, "depth", 1) - 1
        if depth:
            return
        now = time.monotonic()
        took = now - self._local.t0
        with self._lock:
            self.compiled += 1
            self.seconds += took
            assert self._last_info is not None
            report = now - self._last_info >= PROGRESS_S
            if report:
                self._last_info = now
            count, total = self.compiled, self.seconds
        log.debug("compiled %s in %.2f s", _name(ev), took)  # a failure raises in the caller: no word of it here
        if report:
            log.info("numba: %d kernel(s) compiled for this machine in %.0f s so far", count, total)


def _name(ev: Any) -> str:
    """module.function of the dispatcher an event is about."""
    func = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
    if func is None:
        return "a kernel"
    return f"{func.__module__}.{func.__qualname__}"


compile_log = CompileLog()
event.register("numba:compile", compile_log)
