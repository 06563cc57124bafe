"""The CUDA primary context of a one-shot process: made on a side thread while the process is still
importing, and released after the process has gone.

Creating a device's context takes the driver ~0.25 s on an H200 box, and a one-shot ``groth16
prove`` used to pay it after CuPy's import, on the backend's critical path. The driver API called
through ctypes releases the GIL, so a thread that retains the device's primary context runs beside
the imports (CuPy's among them) and the first kernel module CuPy loads finds the context made: the
CUDA runtime uses the same primary context. Best effort: without a driver or a device nothing
happens and the backend reports the error as before.

The context's hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``, read when it is made): a
lasting process (daemon, bench, pipeline) takes the package's 32, which lets a small proof's many
streams overlap; a one-shot process takes ONE_SHOT_CONNECTIONS, the driver's default. What the extra
queues can gain a one-shot process is bounded by its one proof's device time (~17 ms at 2^16; a large
key's MSMs use two streams), while their cost is paid by the context's creation, the one-shot's
critical path. On an H100 box a one-shot 2^16 prove with 32 had its backend ready 0.45-0.69 s after
its imports, key and witness (0.11-0.14 s), and a profiled one retained its context ~0.8 s into the
process; the same steps in one process with the driver's default had the context at 0.27 s, the
backend at 0.39 s and the proof done at 0.46 s (perf/results/oneshot-start-full-h100-2026-12-07.json).
The two settings' A/B, whole one-shot processes interleaved on one H100 box: 0.584 s with 8 against
0.871 s with 32 (medians of 8), the context alone 0.26 s against 0.64 s
(perf/results/oneshot-connections-h100-2026-12-07.json). A caller's own setting wins either way.

At the other end the driver releases the context when the last reference to its device files
closes, which is the exiting process unless someone else holds them: ~0.12 s on an H200 box that
the shell (or a script waiting on the process) sees as part of every one-shot command. With
:func:`hand_off_teardown` a forked child holds the references and releases them once the parent
has gone (perf/results/oneshot-teardown-h200.json).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import warnings

from . import CONNECTIONS_ENV, CONNECTIONS_SET_BY_CALLER
from .env_knobs import EXIT_HANDOFF_ENV, env_switch

log = logging.getLogger("cuzk_mp.backends.gpu.early_context")


def _retain(device: int) -> None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return  # no driver: a CPU-only box (``--backend auto``)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), device) != 0:
        return
    status = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    log.debug("primary context of device %d retained early (CUresult %d)", device, status)


ONE_SHOT_CONNECTIONS = 8


def start_primary_context(device: int = 0) -> threading.Thread:
    """Retain ``device``'s primary context on a daemon thread (kept for the process's life), with
    ONE_SHOT_CONNECTIONS hardware queues unless the caller set ``CUDA_DEVICE_MAX_CONNECTIONS``."""
    if not CONNECTIONS_SET_BY_CALLER:
        os.environ[CONNECTIONS_ENV] = str(ONE_SHOT_CONNECTIONS)
    thread = threading.Thread(target=_retain, args=(device,), name="cuzk-cuda-context", daemon=True)
    thread.start()
    return thread


def hand_off_teardown() -> None:
    """Right before ``os._exit``: fork a child that keeps this process's open files (the CUDA
    driver's among them) until the parent has exited, so the driver releases the context in the
    child, after the parent's exit status is out.

    The child closes stdin, stdout and stderr first (a caller reading the command's output sees its
    end with the parent's), then blocks on a pipe whose write end only the parent holds, and leaves
    with ``os._exit`` when that pipe reads end of file: the parent is gone. It runs no Python code
    that could take a lock another thread held at the fork. Env ``CUZK_GPU_EXIT_HANDOFF=0`` turns
    it off (the parent then pays the release itself, as without this); any failure to fork is the
    same."""
    if not env_switch(EXIT_HANDOFF_ENV, True):
        return
    try:
        r, w = os.pipe()
        with warnings.catch_warnings():  # 3.12 warns on fork() in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        return
    if pid == 0:
        try:
            for fd in (0, 1, 2, w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            while os.read(r, 1):
                pass
        finally:
            os._exit(0)
    os.close(r)
