"""CUDA graphs of dense MSM passes: a small MSM's pass captured once and launched as one call.

Why a module of its own: a small MSM's kernels take tens of microseconds each, so the host's
launches, not the device, set the latency of a lone small proof; :class:`_GraphRun` holds one
captured pass with the buffers it owns, and :meth:`.msm._Msm._graph_run` decides when one is
taken, made or skipped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

import cupy
import numpy as np

from .msm_host import _NoMarks


class _DensePass(Protocol):
    """What a capture needs of an MSM object (:class:`.msm._Msm`, which imports this module): its
    dense pass."""

    def _pippenger(self, scalars: Any, idx: Any, n2: int, per: int, marks: Any) -> tuple[Any, int]: ...


_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (see _GraphRun.capture)


@dataclass
class _GraphRun:
    """A dense pass of k MSMs of m scalars captured into a CUDA graph, with the buffers it owns:
    ``d_in`` (the k m scalars, copied in before each launch) and ``wsums`` (its output); every
    buffer the pass allocates while captured stays alive in ``held`` as long as the graph does.
    ``free``: the event after the last run's copy of ``wsums`` (None: never run); ``busy``: a
    launch has taken it and not yet recorded that event."""

    graph: Any
    d_in: Any
    wsums: Any
    c: int
    held: list[Any]
    free: Any = None
    busy: bool = False

    @classmethod
    def capture(cls, msm: _DensePass, k: int, m: int) -> _GraphRun:
        """Capture ``msm``'s dense pass over k x m scalars on a private stream (relaxed mode, so
        the memory pool may grow meanwhile; its allocations are recorded and kept)."""
        held: list[Any] = []
        pool = cupy.get_default_memory_pool()

        def alloc(size: int) -> Any:
            mem = pool.malloc(size)
            held.append(mem)
            return mem

        d_in = cupy.zeros((k * m, 4), dtype=np.uint64)
        cs = cupy.cuda.Stream(non_blocking=True)
        with _CAPTURE_LOCK, cupy.cuda.using_allocator(alloc), cs:
            cs.begin_capture()
            try:
                wsums, c = msm._pippenger(d_in, None, k * m, m, _NoMarks())
            finally:
                graph = cs.end_capture()
        return cls(graph, d_in, wsums, c, held)


def graphs_supported() -> bool:
    """Whether this CuPy can capture CUDA graphs (not on HIP, nor on a stand-in without streams
    that capture)."""
    runtime = getattr(cupy.cuda, "runtime", None)
    return hasattr(cupy.cuda.Stream, "begin_capture") and not getattr(runtime, "is_hip", False)
