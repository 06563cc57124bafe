"""The CUDA primary context, made on a side thread while the process is still importing.

Creating a device's context takes the driver ~0.25 s on an H200 box, and a one-shot ``groth16
prove`` used to pay it after CuPy's import, on the backend's critical path. The driver API called
through ctypes releases the GIL, so a thread that retains the device's primary context runs beside
the imports (CuPy's among them) and the first kernel module CuPy loads finds the context made: the
CUDA runtime uses the same primary context. Best effort: without a driver or a device nothing
happens and the backend reports the error as before. Importing this module sets what the package
sets for a context (``CUDA_DEVICE_MAX_CONNECTIONS``) before anything is created.
"""

from __future__ import annotations

import ctypes
import logging
import threading

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


def start_primary_context(device: int = 0) -> threading.Thread:
    """Retain ``device``'s primary context on a daemon thread (kept for the process's life)."""
    thread = threading.Thread(target=_retain, args=(device,), name="cuzk-cuda-context", daemon=True)
    thread.start()
    return thread
