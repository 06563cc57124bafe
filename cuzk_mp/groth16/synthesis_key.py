"""Synthesis-only proving keys: a real zkey layout whose points are all zero, made without a setup.

Synthesis reads nothing of a key but its header sizes and its coefficient section (section 4),
which is a function of the r1cs alone (:func:`cuzk_mp.groth16.setup.snarkjs_coefs`). Benchmarks
and tests of synthesis at sizes where a setup would take minutes or hours write such a key in
seconds. It cannot make a proof that verifies: every point is the point at infinity. The zero
sections are written from one broadcast row, so memory stays flat whatever the size.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..algebra.field import Q_MOD, R_MOD, domain_log_size
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
