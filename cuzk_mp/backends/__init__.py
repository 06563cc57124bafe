"""Prover backends: the same interface on the CPU (numba + arkworks) and the GPU (CuPy).

``get_backend`` is the one place that decides which one runs. ``"auto"`` picks
the GPU when CuPy imports and sees a device, else the CPU. CuPy is imported
only inside :mod:`cuzk_mp.backends.gpu`, and only when a GPU is asked for or
probed, so CPU-only processes never initialise CUDA.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # noqa: F401  (probe only; the GPU backend owns cupy)

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001 - any import/driver failure means "no GPU"
        return False


def resolve_backend_name(name: str = "auto") -> str:
    """"auto" -> "gpu" or "cpu"; other names are validated."""
    if name not in ("auto", "cpu", "gpu"):
        raise InputError(f"unknown backend {name!r}: expected auto, cpu or gpu")
    if name == "auto":
        return "gpu" if gpu_available() else "cpu"
    return name


def get_backend(name: str = "auto", device: int | None = None, **kwargs: Any) -> Any:
    """A ready backend instance: ``CpuBackend`` or ``GpuBackend(device)``."""
    resolved = resolve_backend_name(name)
    if resolved == "gpu":
        if not gpu_available():
            raise InputError("backend 'gpu' asked for, but CuPy sees no CUDA device (install the gpu extra?)")
        from .gpu.backend import GpuBackend

        return GpuBackend(device=device or 0, **kwargs)
    from .cpu import CpuBackend

    return CpuBackend(**kwargs)
