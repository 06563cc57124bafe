"""How many of numba's pool threads one call may use, and how idle ones wait.

A synthesis worker runs its kernels with ``threads`` cores per partition, whatever size
``NUMBA_NUM_THREADS`` gave the pool; :func:`numba_threads` narrows numba's thread mask for
the duration of a with-block (the mask is per calling thread, so threads of one process
can use different counts). Asking for more threads than the pool has is clamped to the pool.

Waiting: numba's OpenMP layer (GNU libgomp) lets a thread that has finished its share of a
parallel loop, or waits for the next one, spin for up to ~300,000 iterations before it
sleeps. In one process alone that costs nothing anyone else wanted; in the pipeline, where
several synthesis workers and the provers share the cores, every spin is a core-second
taken from someone's real work. Measured on one 2^20 porep-like partition (2-core VM,
perf/results/synthesis-threads-cpu.json): 2 threads cost 1.19-1.27x the single-thread
core-seconds with the default policy and 0.99-1.02x with ``OMP_WAIT_POLICY=PASSIVE``
(threads sleep at once); the 16-core H200 box measured 1.51x at 4 threads and 1.57x at 16
with the default. :func:`pool_environment` is what every pipeline child gets (the policy is
read when the OpenMP runtime loads, so it must be in the environment before the first
parallel kernel runs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

WAIT_POLICY = "PASSIVE"  # OMP_WAIT_POLICY of pipeline processes (see the module docstring)


def pool_environment(threads: int) -> dict[str, str]:
    """Environment of a process whose numba pool has ``threads`` threads and shares the machine:
    the pool size, and idle threads that sleep instead of spinning (an explicit ``OMP_WAIT_POLICY``
    in this process's environment wins)."""
    return {"NUMBA_NUM_THREADS": str(max(1, threads)),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", WAIT_POLICY)}


def pool_size() -> int:
    """Threads in numba's pool (``NUMBA_NUM_THREADS``)."""
    import numba  # here, not at import: the engine process builds its children's environment without numba

    return int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


@contextmanager
def numba_threads(threads: int) -> Iterator[int]:
    """Run numba kernels in the block on ``threads`` threads (clamped to [1, pool]); yields the count used."""
    import numba

    n = max(1, min(int(threads), pool_size()))
    prev = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(prev)
