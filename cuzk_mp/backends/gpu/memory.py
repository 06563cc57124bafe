"""Device-memory accounting and pinned host ranges for the GPU backend.

* :func:`free_bytes` counts what an allocation can really get: the driver's free
  memory plus the blocks CuPy's pool holds but no array uses.
* :func:`ensure_free` raises :class:`cuzk_mp.errors.ResourceError` (need vs
  free, in GiB, naming what was asked for) BEFORE an allocation would fail with
  a CUDA out-of-memory error half way through a partition.
* :class:`PinnedRanges` registers large host arrays with ``cudaHostRegister``
  for the duration of a copy (55 GB/s instead of ~7 GB/s pageable on the H200,
  reference/h200-facts.md); page ranges are merged so arrays that share a page
  (a, b, c, w in one shm segment) are registered once.
"""

from __future__ import annotations

from typing import Self

import cupy
import numpy as np

from ...errors import ResourceError
from .plan import DEFAULT_MARGIN, GIB

# Arrays smaller than this are copied pageable: registering costs ~53 ms/GiB plus
# a fixed ~0.1 ms, a loss for small copies.
PIN_THRESHOLD = 32 << 20
_PAGE = 4096


def free_bytes() -> tuple[int, int]:
    """(usable free bytes, total bytes) of the current device, counting CuPy's idle pool blocks."""
    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return int(free) + int(pool.free_bytes()), int(total)


def ensure_free(need: int, what: str, margin: int = DEFAULT_MARGIN) -> None:
    """Raise ResourceError unless ``need`` (+ margin) bytes can be allocated now."""
    free, total = free_bytes()
    if need + margin > free:
        dev = cupy.cuda.Device().id
        raise ResourceError(
            f"GPU {dev}: {what} needs {need / GIB:.2f} GiB (+{margin / GIB:.2f} GiB margin) "
            f"but only {free / GIB:.2f} GiB of {total / GIB:.2f} GiB is free; "
            "release staged partitions or keys, or use fewer gpu_workers_per_device")


def grow_pool(nbytes: int) -> bool:
    """Have CuPy's memory pool of the current device take ``nbytes`` from the driver in one block
    now, kept idle in the pool (the pool splits it for the allocations that follow): a key for one
    proof asks for what its partition will hold at its peak while its sections upload, so the proof's
    buffers need no driver allocation each (a one-shot 2^16 proof's device step ~5 ms shorter on an
    H100, for ~0.5 ms of allocation beside the upload). False where the driver refused (the proof
    then allocates as it goes)."""
    if nbytes <= 0:
        return True
    try:
        cupy.get_default_memory_pool().malloc(int(nbytes))  # released at once: the block stays in the pool
    except cupy.cuda.memory.OutOfMemoryError:
        return False
    return True


def _page_range(a: np.ndarray) -> tuple[int, int]:
    start = int(a.ctypes.data)
    return start & ~(_PAGE - 1), -(-(start + a.nbytes) // _PAGE) * _PAGE


class PinnedRanges:
    """Registers the pages of some host arrays as pinned memory until :meth:`close`."""

    def __init__(self, arrays: list[np.ndarray], threshold: int = PIN_THRESHOLD) -> None:
        self.registered: list[int] = []
        self.nbytes = 0
        ranges = sorted(_page_range(a) for a in arrays if a.nbytes >= threshold and a.flags.c_contiguous)
        merged: list[list[int]] = []
        for lo, hi in ranges:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        for lo, hi in merged:
            try:
                cupy.cuda.runtime.hostRegister(lo, hi - lo, 0)  # 0 = cudaHostRegisterDefault
            except cupy.cuda.runtime.CUDARuntimeError:
                continue  # already registered elsewhere, or not registrable: the copy stays pageable
            self.registered.append(lo)
            self.nbytes += hi - lo

    def close(self) -> None:
        """Unregister every range this object registered (idempotent)."""
        for lo in self.registered:
            cupy.cuda.runtime.hostUnregister(lo)
        self.registered = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
