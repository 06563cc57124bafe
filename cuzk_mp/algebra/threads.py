"""How many of numba's pool threads one call may use.

A synthesis worker runs its kernels with ``threads`` cores per partition, whatever size
``NUMBA_NUM_THREADS`` gave the pool; :func:`numba_threads` narrows numba's thread mask for
the duration of a with-block (the mask is per calling thread, so threads of one process
can use different counts). Asking for more threads than the pool has is clamped to the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba


def pool_size() -> int:
    """Threads in numba's pool (``NUMBA_NUM_THREADS``)."""
    return int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


@contextmanager
def numba_threads(threads: int) -> Iterator[int]:
    """Run numba kernels in the block on ``threads`` threads (clamped to [1, pool]); yields the count used."""
    n = max(1, min(int(threads), pool_size()))
    prev = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(prev)
