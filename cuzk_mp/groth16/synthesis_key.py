"""Synthesis-only proving keys: a real zkey layout whose points are all zero, made without a setup.

Synthesis reads nothing of a key but its header sizes and its coefficient section (section 4),
which is a function of the r1cs alone (:func:`cuzk_mp.groth16.setup.snarkjs_coefs`). Benchmarks
and tests of synthesis at sizes where a setup would take minutes or hours write such a key in
seconds. It cannot make a proof that verifies: every point is the point at infinity. The zero
sections are written from one broadcast row, so memory stays flat whatever the size.
:func:`tiny_zkey_and_r1cs` is the smallest such pair, in memory, for warming up kernels.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..algebra.field import Q_MOD, R_MOD, domain_log_size
from ..algebra.sparse import CsrMatrix
from ..formats.r1cs import R1CS
from ..formats.zkey import ZKey, empty_contributions, write_zkey
from .setup import snarkjs_coefs


def write_synthesis_only_zkey(r1cs: R1CS, path: str | os.PathLike[str]) -> None:
    """Write the zero-point key of ``r1cs`` (its domain: the smallest power of two >= nConstraints + nPublic + 1)."""
    n = 1 << domain_log_size(r1cs.n_constraints + r1cs.n_public + 1)
    nv, npub = r1cs.n_wires, r1cs.n_public

    def zeros(rows: int, width: int) -> Any:  # a one-chunk list, as write_zkey takes big sections
        return [np.broadcast_to(np.zeros(width, np.uint64), (rows, width))]

    g1, g2 = np.zeros(12, np.uint64), np.zeros(24, np.uint64)
    write_zkey(path, ZKey(path=None, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=nv, n_public=npub, domain_size=n,
                          alpha1=g1, beta1=g1, beta2=g2, gamma2=g2, delta1=g1, delta2=g2, ic=zeros(npub + 1, 12),
                          coefs=snarkjs_coefs(r1cs), a=zeros(nv, 12), b1=zeros(nv, 12), b2=zeros(nv, 24),
                          c=zeros(nv - npub - 1, 12), h=zeros(n, 12), contributions=empty_contributions()))


def tiny_zkey_and_r1cs() -> tuple[ZKey, R1CS]:
    """A two-constraint circuit (w1 * w1 = w2, w2 * 1 = w2) and its zero-point key, in memory (kernel warm-up)."""
    one = np.array([[1, 0, 0, 0]], dtype=np.uint64)

    def rows(cols: list[int]) -> CsrMatrix:
        return CsrMatrix(np.arange(len(cols) + 1, dtype=np.int64), np.array(cols, dtype=np.uint32),
                         np.repeat(one, len(cols), axis=0), 3)

    r1cs = R1CS(prime=R_MOD, n_wires=3, n_pub_out=0, n_pub_in=0, n_prv_in=0, n_labels=3, n_constraints=2,
                a=rows([1, 2]), b=rows([1, 0]), c=rows([2, 2]), wire_to_label=None, path=None)
    n = 4
    g1, g2 = np.zeros(12, np.uint64), np.zeros(24, np.uint64)
    zkey = ZKey(path=None, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=3, n_public=0, domain_size=n, alpha1=g1,
                beta1=g1, beta2=g2, gamma2=g2, delta1=g1, delta2=g2, ic=np.zeros((1, 12), np.uint64),
                coefs=snarkjs_coefs(r1cs), a=np.zeros((3, 12), np.uint64), b1=np.zeros((3, 12), np.uint64),
                b2=np.zeros((3, 24), np.uint64), c=np.zeros((2, 12), np.uint64), h=np.zeros((n, 12), np.uint64),
                contributions=empty_contributions())
    return zkey, r1cs
