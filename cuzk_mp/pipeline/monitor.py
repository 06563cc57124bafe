"""Measurement helpers shared by the engine's status/metrics and ``cuzk-mp bench``.

Owns no process state: a cumulative histogram type, the resident memory of a
process tree, and a sampler thread that records the peak host memory of the
pipeline (process tree RSS plus the live shm bytes of one prefix).

Host memory is counted as RSS of the engine process and all its descendants
plus the tmpfs bytes of the ring's segments. Shared pages mapped by several
processes are counted once per mapper in RSS; segments are mapped only while
being written or staged, so the overlap is small and the figure errs high.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from .ring import live_segments, shm_bytes

STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class Histogram:
    """A Prometheus-style cumulative histogram of seconds."""

    buckets: tuple[float, ...] = STAGE_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        """Add one observation."""
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def to_dict(self) -> dict[str, object]:
        """``{"buckets": [[le, cumulative count], ...], "sum": s, "count": n}`` (+Inf is ``count``)."""
        counts = self.counts or [0] * len(self.buckets)
        return {"buckets": [[b, c] for b, c in zip(self.buckets, counts)], "sum": self.total, "count": self.n}


def _tree(pid: int | None) -> list[tuple[str, psutil.Process]]:
    """(name, process) for a process and each descendant; the root is named ``"engine"``."""
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            out.append(("engine" if p.pid == root.pid else p.name(), p))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _by_name(pid: int | None, read: Callable[[psutil.Process], int]) -> dict[str, int]:
    """``read(process)`` summed per name over the tree (vanished processes are skipped)."""
    out: dict[str, int] = {}
    for name, p in _tree(pid):
        try:
            out[name] = out.get(name, 0) + read(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def tree_rss(pid: int | None = None) -> dict[str, int]:
    """RSS (bytes) of a process and each descendant, keyed ``<name>`` (the OS process name; the
    pipeline's children set theirs to cuzk-synth-<i> / cuzk-gpu-<dev>); the root is ``"engine"``."""
    return _by_name(pid, lambda p: int(p.memory_info().rss))


def _peak_rss(p: psutil.Process) -> int:
    """The kernel's high-water mark of the process's RSS (``VmHWM``); its RSS where there is none."""
    try:
        with open(f"/proc/{p.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(p.memory_info().rss)


def tree_peak_rss(pid: int | None = None) -> dict[str, int]:
    """Peak RSS (bytes) of each process of the tree since its start or its last :func:`reset_peak_rss`.

    Exact where sampling is not: the kernel keeps the high-water mark, so a transient peak between
    two samples is not missed. Keyed like :func:`tree_rss`.
    """
    return _by_name(pid, _peak_rss)


def reset_peak_rss(pid: int | None = None) -> bool:
    """Reset every tree process's RSS high-water mark to its current RSS (Linux ``clear_refs`` 5).

    Returns False when some process's mark could not be reset (not Linux, or not permitted); its
    peak then also counts what it used before the reset (errs high).
    """
    ok = True
    for _, p in _tree(pid):
        try:
            with open(f"/proc/{p.pid}/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok


def tree_rss_bytes(pid: int | None = None) -> int:
    """RSS of a process and all its descendants (bytes; vanished processes are skipped)."""
    return sum(tree_rss(pid).values())


class MemorySampler:
    """A thread sampling host RSS (tree) + shm bytes of ``prefix`` every ``interval_s``; keeps the peaks."""

    def __init__(self, prefix: str, interval_s: float = 0.1, pid: int | None = None) -> None:
        self.prefix = prefix
        self.interval_s = interval_s
        self.pid = pid or os.getpid()
        self.peak_host_bytes = 0
        self.peak_rss_bytes = 0
        self.peak_shm_bytes = 0
        self.peak_live_segments = 0
        self.samples = 0
        self.timeline: list[tuple[float, int]] = []  # (time.time(), host bytes) of every sample
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cuzk-mem-sampler", daemon=True)

    def start(self) -> MemorySampler:
        """Start sampling; returns self."""
        self._thread.start()
        return self

    def sample(self) -> None:
        """Take one sample now (thread-safe: the sampler thread and event callbacks both call it)."""
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        rss, shm = tree_rss_bytes(self.pid), shm_bytes(self.prefix)
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.peak_shm_bytes = max(self.peak_shm_bytes, shm)
        self.peak_host_bytes = max(self.peak_host_bytes, rss + shm)
        self.timeline.append((time.time(), rss + shm))
        self.peak_live_segments = max(self.peak_live_segments, live_segments(self.prefix))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, object]:
        """Stop and return the peaks (totals) and the timeline of (time, host bytes) samples."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        return {"peak_host_bytes": self.peak_host_bytes, "peak_rss_bytes": self.peak_rss_bytes,
                "peak_shm_bytes": self.peak_shm_bytes, "peak_live_segments": self.peak_live_segments,
                "samples": self.samples, "timeline": list(self.timeline)}

