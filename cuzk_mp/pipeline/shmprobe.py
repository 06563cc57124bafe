"""Measure the first-touch cost of shm segments, to justify the ring's choices (docs/ring.md, "Costs").

``python -m cuzk_mp.pipeline.shmprobe --mib 256 --repeat 5 [--json PATH]`` writes
one array into a POSIX shm segment per strategy and reports the median wall time
of producer (get the segment + fill) and consumer (map + copy out):

* ``plain``        fresh segment: mmap, then numpy copy (one page fault per 4 KiB page)
* ``fallocate``    fresh segment: posix_fallocate the tmpfs file first, then copy
* ``map_populate`` fresh segment: mmap(MAP_POPULATE), then copy
* ``madv_populate`` fresh segment: mmap, madvise(MADV_POPULATE_WRITE), then copy (a new slot segment)
* ``threads``      fresh segment: plain mapping, copy split over 2 threads
* ``remap``        an existing segment (pages allocated) mapped again + MADV_POPULATE_WRITE, then copy
                   (a slot's segment in a process that has not mapped it yet)
* ``reuse``        an existing segment through a mapping kept from before, then copy (the ring's
                   steady state); its consumer copies out of a kept mapping too

Owns nothing persistent: every segment it creates is unlinked before it returns.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import threading
import time

import numpy as np
import posix_ipc

from ..paths import FileArg
from .segment import MADV_POPULATE_WRITE

STRATEGIES = ("plain", "fallocate", "map_populate", "madv_populate", "threads", "remap", "reuse")


def _fill(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    if threads == 1:
        np.copyto(dst, src)
        return
    parts = np.array_split(np.arange(len(dst)), threads)
    workers = [threading.Thread(target=np.copyto, args=(dst[p[0] : p[-1] + 1], src[p[0] : p[-1] + 1])) for p in parts]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


def probe_once(strategy: str, src: np.ndarray, name: str) -> dict[str, float]:
    """One producer + consumer round trip with ``strategy``; seconds for each side."""
    size = src.nbytes
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=size)
    kept: list[mmap.mmap] = []
    try:
        if strategy in ("remap", "reuse"):  # the segment exists, every page allocated, by an earlier partition
            first = mmap.mmap(shm.fd, size)
            first.madvise(MADV_POPULATE_WRITE)
            _fill(np.frombuffer(first, np.uint64), src, 1)
            if strategy == "reuse":
                kept = [first, mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)]
            else:
                first.close()
        t0 = time.perf_counter()
        if strategy == "fallocate":
            os.posix_fallocate(shm.fd, 0, size)
        if strategy == "reuse":
            buf = kept[0]
        else:
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if strategy == "map_populate" else 0)
            buf = mmap.mmap(shm.fd, size, flags=flags)
            if strategy in ("madv_populate", "remap"):
                buf.madvise(MADV_POPULATE_WRITE)
        dst = np.frombuffer(buf, np.uint64)
        _fill(dst, src, 2 if strategy == "threads" else 1)
        t1 = time.perf_counter()
        del dst
        if strategy != "reuse":
            buf.close()
        out = np.empty_like(src)
        out[:] = 0  # the consumer's private copy is faulted in outside the timing: only the read is timed
        t2 = time.perf_counter()
        rbuf = kept[1] if strategy == "reuse" else mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        np.copyto(out, np.frombuffer(rbuf, np.uint64))
        t3 = time.perf_counter()
        del out
        rbuf.close()
    finally:
        for m in kept:
            m.close()
        os.close(shm.fd)
        posix_ipc.unlink_shared_memory(name)
    return {"producer_s": t1 - t0, "consumer_s": t3 - t2}


def run_probe(mib: int, repeat: int) -> dict[str, object]:
    """Medians over ``repeat`` rounds of every strategy, plus a warm memcpy reference."""
    src = np.random.default_rng(7).integers(0, 2**63, (mib << 20) // 8, dtype=np.uint64)
    warm = np.empty_like(src)
    np.copyto(warm, src)
    t0 = time.perf_counter()
    np.copyto(warm, src)
    warm_s = time.perf_counter() - t0
    del warm
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in STRATEGIES}
    name = f"/cuzk-shmprobe-{os.getpid()}"
    for _ in range(repeat):
        for strategy in STRATEGIES:
            runs[strategy].append(probe_once(strategy, src, name))
    result: dict[str, object] = {"bytes": src.nbytes, "repeat": repeat, "warm_memcpy_gbps": src.nbytes / warm_s / 1e9,
                                 "loadavg": os.getloadavg()}
    for strategy, rs in runs.items():
        prod = statistics.median(r["producer_s"] for r in rs)
        cons = statistics.median(r["consumer_s"] for r in rs)
        result[strategy] = {"producer_s": prod, "producer_gbps": src.nbytes / prod / 1e9,
                            "consumer_s": cons, "consumer_gbps": src.nbytes / cons / 1e9}
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: print (and optionally save) the probe's JSON."""
    ap = argparse.ArgumentParser(prog="python -m cuzk_mp.pipeline.shmprobe", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=FileArg("probe's JSON", output=True))
    args = ap.parse_args(argv)
    for flag, value in (("--mib", args.mib), ("--repeat", args.repeat)):
        if value < 1:
            ap.error(f"{flag} {value}: must be at least 1")
    result = run_probe(args.mib, args.repeat)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
