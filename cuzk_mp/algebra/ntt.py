"""Radix-2 number-theoretic transforms over Fr on the CPU, and the Groth16 H step.

Conventions (the GPU backend implements the same ones):

* ``ntt(a)``: A_k = sum_j a_j w^(jk) with w = ``fr_root_of_unity(log n)``
  (snarkjs ``Fr.w[k]``), natural order in and out, Montgomery form.
* ``intt(A)``: the inverse, scaled by 1/n.
* ``coset_h(a, b, c)``: snarkjs prover steps 2-3: for X in (a, b, c) take
  iNTT, multiply coefficient i by ``coset_shift(log n)``^i, NTT back; return
  p = a_odd * b_odd - c_odd in *standard* form (the H MSM's scalars).

Twiddle tables are cached per (size, direction) for the life of the process.
"""

from __future__ import annotations

import numpy as np

from . import fr, fr_kernels
from .field import R_MOD, coset_shift, fr_root_of_unity, log2_exact
from .jit import njit, prange

fmul = fr_kernels.fmul
fadd = fr_kernels.fadd
fsub = fr_kernels.fsub


@njit(parallel=True, cache=True)
def _bitrev_in_place(a, logn):  # type: ignore[no-untyped-def]
    n = a.shape[0]
    for i in prange(n):
        r = 0
        for b in range(logn):
            r = (r << 1) | ((i >> b) & 1)
        if i < r:
            for limb in range(4):
                t = a[i, limb]
                a[i, limb] = a[r, limb]
                a[r, limb] = t


@njit(parallel=True, cache=True)
def _stages(a, tw, logn):  # type: ignore[no-untyped-def]
    # Cooley-Tukey DIT on bit-reversed input: stage s combines blocks of 2^s.
    n = a.shape[0]
    half_n = n >> 1
    for s in range(logn):
        half = 1 << s
        stride = n >> (s + 1)
        for idx in prange(half_n):
            j = idx & (half - 1)
            i1 = ((idx >> s) << (s + 1)) | j
            i2 = i1 + half
            k = j * stride
            v0, v1, v2, v3 = fmul(a[i2, 0], a[i2, 1], a[i2, 2], a[i2, 3], tw[k, 0], tw[k, 1], tw[k, 2], tw[k, 3])
            u0, u1, u2, u3 = a[i1, 0], a[i1, 1], a[i1, 2], a[i1, 3]
            a[i1, 0], a[i1, 1], a[i1, 2], a[i1, 3] = fadd(u0, u1, u2, u3, v0, v1, v2, v3)
            a[i2, 0], a[i2, 1], a[i2, 2], a[i2, 3] = fsub(u0, u1, u2, u3, v0, v1, v2, v3)


_TWIDDLES: dict[tuple[int, bool], np.ndarray] = {}


def twiddles(log_n: int, inverse: bool = False) -> np.ndarray:
    """[w^i for i < n/2] (Montgomery) for the 2^log_n domain, w inverted when ``inverse``."""
    key = (log_n, inverse)
    if key not in _TWIDDLES:
        w = fr_root_of_unity(log_n)
        if inverse:
            w = pow(w, -1, R_MOD)
        _TWIDDLES[key] = fr.powers(w, max(1, (1 << log_n) // 2))
    return _TWIDDLES[key]


def ntt_in_place(a: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Transform ``a`` in place (no 1/n scaling even when ``inverse``); returns ``a``."""
    log_n = log2_exact(a.shape[0])
    if log_n == 0:
        return a
    _bitrev_in_place(a, log_n)
    _stages(a, twiddles(log_n, inverse), log_n)
    return a


def ntt(a: np.ndarray) -> np.ndarray:
    """Forward NTT of a Montgomery Fr vector (new array)."""
    return ntt_in_place(np.array(a, dtype=np.uint64, copy=True))


def intt(a: np.ndarray) -> np.ndarray:
    """Inverse NTT, scaled by 1/n (new array)."""
    out = ntt_in_place(np.array(a, dtype=np.uint64, copy=True), inverse=True)
    return fr.mul_into(out, _scale_vector(out.shape[0]), out) if out.shape[0] > 1 else out


def _scale_vector(n: int) -> np.ndarray:
    return np.broadcast_to(fr.const(pow(n, -1, R_MOD)), (n, 4)).copy()


_COSET: dict[int, np.ndarray] = {}


def coset_scale_powers(log_n: int) -> np.ndarray:
    """[shift^i / n for i < n] (Montgomery): folds the iNTT's 1/n into the coset scaling."""
    if log_n not in _COSET:
        n = 1 << log_n
        _COSET[log_n] = fr.powers(coset_shift(log_n), n, start=pow(n, -1, R_MOD))
    return _COSET[log_n]


def to_odd_coset_in_place(x: np.ndarray) -> np.ndarray:
    """Values on the n-domain -> values on the odd coset of the 2n-domain, in place."""
    log_n = log2_exact(x.shape[0])
    ntt_in_place(x, inverse=True)
    fr.mul_into(x, coset_scale_powers(log_n), x)
    return ntt_in_place(x)


def coset_h(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p = (A*B - C) on the odd coset, standard form (snarkjs ``groth16_prove.js`` steps 2-3)."""
    xs = [to_odd_coset_in_place(np.array(v, dtype=np.uint64, copy=True)) for v in (a, b, c)]
    return fr.from_mont(fr.mul_sub(xs[0], xs[1], xs[2]))
