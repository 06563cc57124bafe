"""Host-memory accounting of the pipeline's process tree, and a sampler of its peaks.

Owns no pipeline state. One accounting serves the engine's status, the bench's
peak and the bound that peak is checked against (docs/architecture.md, "Memory"):

* per process, from ``/proc/PID/smaps_rollup``: ``pss``, its proportional set size
  without shared-memory pages (``Pss - Pss_Shmem``): a page mapped by k processes,
  such as a proving key every process maps, counts 1/k in each and so once in the
  sum; ``uss``, the pages only it maps (``Private_Clean + Private_Dirty``, a ring
  segment it is writing included); ``anon``, its anonymous memory (heap and arrays:
  what it holds privately, neither file nor shm pages); and ``rss`` for reference;
* the ring's segments, once: the tmpfs blocks held by the engine's prefix;
* host bytes = the sum of ``pss`` over the tree + the ring's shm bytes.
"""

from __future__ import annotations

import os
import threading
import time

import msgspec
import psutil

from .shm_names import live_segments, shm_bytes

_ROLLUP_KEYS = {"Rss": "rss", "Pss": "pss", "Pss_Shmem": "pss_shmem", "Pss_Anon": "pss_anon",
                "Private_Clean": "private_clean", "Private_Dirty": "private_dirty", "Anonymous": "anon"}


class ProcessMemory(msgspec.Struct):
    """One process's memory (bytes) as the accounting above counts it."""

    name: str
    pid: int
    pss: int
    uss: int
    anon: int
    rss: int


def read_smaps_rollup(pid: int) -> dict[str, int] | None:
    """The fields of ``/proc/PID/smaps_rollup`` this module uses, in bytes; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = dict.fromkeys(_ROLLUP_KEYS.values(), 0)
    for line in lines[1:]:
        key, _, rest = line.partition(":")
        if key in _ROLLUP_KEYS:
            out[_ROLLUP_KEYS[key]] = int(rest.split()[0]) * 1024
    return out


def process_memory(pid: int, name: str) -> ProcessMemory | None:
    """One process's :class:`ProcessMemory`; None if it is gone."""
    r = read_smaps_rollup(pid)
    if r is None:
        return None
    return ProcessMemory(name=name, pid=pid, pss=r["pss"] - r["pss_shmem"],
                         uss=r["private_clean"] + r["private_dirty"], anon=r["anon"], rss=r["rss"])


def tree_memory(pid: int | None = None) -> list[ProcessMemory]:
    """Every process of the tree rooted at ``pid`` (default: this one, named ``"engine"``); children
    carry their OS names (the pipeline's are cuzk-synth-<i> and cuzk-prover-<dev>)."""
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            name = "engine" if p.pid == root.pid else p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        mem = process_memory(p.pid, name)
        if mem is not None:
            out.append(mem)
    return out


def host_bytes(tree: list[ProcessMemory], shm: int) -> int:
    """The host memory of the pipeline: the tree's PSS plus the ring's shm bytes."""
    return sum(m.pss for m in tree) + shm


class MemorySampler:
    """A thread that samples the tree and the ring's shm every ``interval_s``; keeps the peaks.

    Per-process peaks are kept by process name (a restarted child keeps its name), so a
    kind's working set can be read off them; ``timeline`` has (``time.monotonic()``, host bytes) of every sample,
    and ``timeline_detail`` (``time.monotonic()``, PSS by process name, shm bytes) of the same samples.
    """

    def __init__(self, prefix: str, interval_s: float = 0.1, pid: int | None = None) -> None:
        self.prefix = prefix
        self.interval_s = interval_s
        self.pid = pid or os.getpid()
        self.peak_host_bytes = 0
        self.peak_pss_bytes = 0
        self.peak_rss_bytes = 0
        self.peak_shm_bytes = 0
        self.peak_live_segments = 0
        self.peak_pss: dict[str, int] = {}
        self.peak_uss: dict[str, int] = {}
        self.peak_anon: dict[str, int] = {}
        self.samples = 0
        self.timeline: list[tuple[float, int]] = []
        self.timeline_detail: list[tuple[float, dict[str, int], int]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cuzk-mem-sampler", daemon=True)

    def start(self) -> MemorySampler:
        """Start sampling; returns self."""
        self._thread.start()
        return self

    def sample(self) -> list[ProcessMemory]:
        """Take one sample now (thread-safe: the sampler thread and event callbacks both call it)."""
        with self._lock:
            tree, shm = tree_memory(self.pid), shm_bytes(self.prefix)
            host = host_bytes(tree, shm)
            self.peak_host_bytes = max(self.peak_host_bytes, host)
            self.peak_pss_bytes = max(self.peak_pss_bytes, host - shm)
            self.peak_rss_bytes = max(self.peak_rss_bytes, sum(m.rss for m in tree))
            self.peak_shm_bytes = max(self.peak_shm_bytes, shm)
            self.peak_live_segments = max(self.peak_live_segments, live_segments(self.prefix))
            for m in tree:
                for peaks, value in ((self.peak_pss, m.pss), (self.peak_uss, m.uss), (self.peak_anon, m.anon)):
                    peaks[m.name] = max(peaks.get(m.name, 0), value)
            # on the monotonic clock, as what they are held against (the bench's job windows) and drawn
            # beside (the engine's spans)
            now = time.monotonic()
            self.timeline.append((now, host))
            by_name: dict[str, int] = {}
            for m in tree:
                by_name[m.name] = by_name.get(m.name, 0) + m.pss
            self.timeline_detail.append((now, by_name, shm))
            self.samples += 1
            return tree

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, object]:
        """Stop and return the peaks (totals and per process) and the timeline."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        return {"peak_host_bytes": self.peak_host_bytes, "peak_pss_bytes": self.peak_pss_bytes,
                "peak_rss_bytes": self.peak_rss_bytes, "peak_shm_bytes": self.peak_shm_bytes,
                "peak_live_segments": self.peak_live_segments, "peak_pss_by_process": dict(self.peak_pss),
                "peak_uss_by_process": dict(self.peak_uss), "peak_anon_by_process": dict(self.peak_anon),
                "samples": self.samples, "timeline": list(self.timeline),
                "timeline_detail": list(self.timeline_detail)}
