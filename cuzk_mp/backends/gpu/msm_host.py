"""The host side of an MSM run: its results' copies, conversion and Horner sum, and its timing marks.

Why a module of its own: everything an MSM does between the device and the host lives here, apart
from the kernels: page-locked arrays and the asynchronous copies into them, CUDA event marks per
phase, the XYZZ-to-arkworks conversion of the window sums and their Horner combination, and the
small argument helpers every launch uses. The MSM objects (:mod:`.msm`), their passes
(:mod:`.msm_passes`) and the scalar plans (:mod:`.msm_plan`) share them.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from ...algebra.curve import g1_to_ark, g2_to_ark
from ...algebra.field import Q_MOD, fq2_inv_int, fq2_mul_int, limbs_to_ints
from ...errors import InputError

_NULL = np.uint64(0)  # a null device pointer argument
_D2H, _D2D = 2, 3  # cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice


# ------------------------------------------------------------------ result conversion


def point_from_xyzz(words: np.ndarray, g2: bool) -> G1Point | G2Point:
    """An XYZZ point as stored by the kernels (Montgomery limbs) -> arkworks point.

    ``words``: 24 uint64 (G1: X, Y, ZZ, ZZZ) or 48 (G2, each coordinate c0, c1);
    ZZ = 0 is infinity. x = X / ZZ, y = Y / ZZZ with Python ints, straight on the
    Montgomery values (the factors R cancel), with one inversion for both
    denominators (1/ZZ = ZZZ / (ZZ ZZZ), 1/ZZZ = ZZ / (ZZ ZZZ)).
    """
    vals = limbs_to_ints(np.asarray(words, dtype=np.uint64).reshape(-1, 6))
    if not g2:
        X, Y, ZZ, ZZZ = vals
        if ZZ % Q_MOD == 0:
            return G1Point.identity()
        t = pow(ZZ * ZZZ, -1, Q_MOD)
        return g1_to_ark((X * ZZZ * t % Q_MOD, Y * ZZ * t % Q_MOD))
    X2, Y2, ZZ2, ZZZ2 = ((vals[i], vals[i + 1]) for i in range(0, 8, 2))
    if ZZ2[0] % Q_MOD == 0 and ZZ2[1] % Q_MOD == 0:
        return G2Point.identity()
    t2 = fq2_inv_int(fq2_mul_int(ZZ2, ZZZ2))
    return g2_to_ark((fq2_mul_int(X2, fq2_mul_int(ZZZ2, t2)), fq2_mul_int(Y2, fq2_mul_int(ZZ2, t2))))


def horner(wsums: np.ndarray, c: int, extra: np.ndarray, g2: bool) -> G1Point | G2Point:
    """sum_w 2^(c w) wsums[w] + sum(extra) on the host (arkworks), XYZZ rows in.

    The doubling chain of the windows is c (W - 1) long whatever the parallelism;
    arkworks does it in ~1 ms where one GPU thread took ~9.5 ms (G2, c = 20).
    """
    acc = (G2Point if g2 else G1Point).identity()
    step = Scalar(1 << c)
    for w in range(wsums.shape[0] - 1, -1, -1):
        acc = acc * step + point_from_xyzz(wsums[w], g2)
    for row in extra:
        acc = acc + point_from_xyzz(row, g2)
    return acc


# ------------------------------------------------------------------ helpers


class _Marks:
    """CUDA events on one stream; ms per named span (repeated names add up)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.marks: list[tuple[str, Any]] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        ev = cupy.cuda.Event()
        ev.record(self.stream)
        self.marks.append((name, ev))

    @property
    def last(self) -> Any:
        return self.marks[-1][1]

    def spans(self) -> dict[str, float]:
        self.last.synchronize()
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + float(cupy.cuda.get_elapsed_time(a, b))
        out["total"] = float(cupy.cuda.get_elapsed_time(self.marks[0][1], self.last))
        return out


class _NoMarks(_Marks):
    """Marks that record nothing: a pass being captured into a graph (events recorded inside a
    capture are not timing events)."""

    def __init__(self) -> None:
        self.marks = []

    def mark(self, name: str) -> None:
        return None


def _as_rows(a: Any, width: int, what: str) -> Any:
    """A C-contiguous ``(n, width)`` uint64 device array (uploads a host array)."""
    d = cupy.ascontiguousarray(cupy.asarray(a))
    if d.dtype != np.uint64 or d.ndim != 2 or d.shape[1] != width:
        raise InputError(f"{what}: expected an (n, {width}) uint64 array, got {d.dtype} {tuple(d.shape)}")
    return d


def _address(a: Any) -> int:
    """Where an array's data starts (0 for None): a device pointer, or a host one under a CPU
    stand-in for CuPy whose arrays are numpy's."""
    if a is None:
        return 0
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def _u32(x: int) -> np.uint32:
    return np.uint32(x)


def _u64(x: int) -> np.uint64:
    return np.uint64(x)


def _copy_device_async(src: Any, dst: Any, stream: Any) -> None:
    """Enqueue a device -> device copy of a whole C-contiguous array into another of its size."""
    cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, _D2D, stream.ptr)


def _copy_to_host_async(d: Any, host: np.ndarray, stream: Any) -> None:
    """Enqueue device -> page-locked host copy of a whole C-contiguous array on ``stream``."""
    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, d.data.ptr, host.nbytes, _D2H, stream.ptr)


def _pinned_like(a: np.ndarray) -> np.ndarray:
    """A zeroed page-locked host array of ``a``'s shape and dtype (the target of an async copy)."""
    mem = cupy.cuda.alloc_pinned_memory(max(1, a.nbytes))
    out = np.frombuffer(mem, dtype=a.dtype, count=a.size).reshape(a.shape)
    out[...] = 0
    return out
