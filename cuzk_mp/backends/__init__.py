"""Prover backends: the same interface on the CPU (numba + arkworks) and the GPU (CuPy).

``get_backend`` is the one place that decides which one runs. ``"auto"`` picks
the GPU when CuPy imports and sees a device, else the CPU. CuPy is imported
only inside :mod:`cuzk_mp.backends.gpu` and by the probe :func:`gpu_available`,
so only when a GPU is asked for or probed: CPU-only processes never initialise CUDA.
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


def gpu_unavailable_reason(probe_device: bool = True) -> str | None:
    """Why the GPU backend cannot run here, in words for the user, or None where it can. Without
    ``probe_device`` only CuPy's presence is checked (no CUDA initialisation in this process:
    the engine's parent, whose GPU work is its prover processes')."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return ("CuPy is not installed (`make venv` installs the GPU extra where it finds the driver; "
                "or pip install -e '.[gpu]')")
    if probe_device and not gpu_available():
        return ("CuPy is installed but sees no CUDA device (python -c 'import cupy; "
                "cupy.cuda.runtime.getDeviceCount()' says why)")
    return None


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
        why = gpu_unavailable_reason()
        if why is not None:
            raise InputError(f"backend 'gpu' asked for, but {why}")
        from .gpu.env_knobs import check_environment

        check_environment()  # a misspelt CUZK_GPU_* knob or a refused value: ConfigError, before any upload
        from .gpu.backend import GpuBackend

        return GpuBackend(device=device or 0, **kwargs)
    from .cpu import CpuBackend

    return CpuBackend(**kwargs)
