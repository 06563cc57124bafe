"""A stand-in child role for process tests (spawned as ``ChildSpec(module="tests.child_roles")``):
it reports what the bootstrap set up in its READY, then waits to be stopped."""

from __future__ import annotations

import os
import sys
from typing import Any


def main(ctx: Any, payload: Any) -> None:
    """Report the environment in READY."""
    from cuzk_mp.pipeline import messages as msg

    ctx.send(msg.Ready(os.getpid(), ctx.name, {
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
        "cupy_imported": int("cupy" in sys.modules), "payload": str(payload)}))
    ctx.stopping.wait(30)
