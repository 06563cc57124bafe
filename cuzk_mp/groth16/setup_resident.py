"""Development (INSECURE) proving keys generated straight into a backend: no key file, no host copy of the points.

A snarkjs-format key of the 2^27 PoRep-like circuit is ~100 GB: it does not fit a 64 GiB disk,
and writing then reading it costs minutes. A benchmark needs the key only where it is used, so
:func:`setup_resident` makes the same key as :func:`~.setup.setup` (the same toxic waste gives
the same points, byte for byte) but hands every section's scalars to ``backend.generate_key``,
which turns them into points where the key lives: in device memory with the GPU fixed-base
kernels, in host memory on the CPU backend. Only the head of the key (alpha, beta, gamma,
delta, IC: what the proof's last step and the verification key need) stays on the host.

The QAP columns at tau come from the circuit's compact data (:mod:`.circuit_data`: coded A with
the public rows, B and C, the rows synthesis reads), not from a parsed r1cs: transposed products
over uint32 columns and small codes (:func:`cuzk_mp.algebra.coded_sparse.rmatvec`), so the host
holds the mapped circuit data, the Lagrange values and the three QAP vectors (each dropped when
its last section is made), never 36-byte entries of the three matrices.

Every party that uses such a key must be given the same :class:`~.setup.ToxicWaste` (an engine
draws it once per circuit and hands it to each prover process); the verification key follows
from the head (:func:`cuzk_mp.groth16.keys.vk_from_zkey`). Whoever holds the toxic waste can
forge proofs: for development and benchmarks only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ..algebra import coded_sparse, fr
from ..algebra.field import Q_MOD, R_MOD, fr_root_of_unity
from ..formats.zkey import ZKey, empty_contributions
from .circuit_data import CircuitData
from .setup import INSECURE_WARNING, ToxicWaste, h_scalars, lagrange_factor

log = logging.getLogger("cuzk_mp.groth16.setup_resident")

# Sections in the order generate_key receives them (the zkey's order): name, group, scalars.
SectionScalars = list[tuple[str, str, Callable[[], np.ndarray]]]


@dataclass
class ResidentKey:
    """A generated key: its head (a :class:`ZKey` without coefficient and point sections) and the
    backend's handle of the resident points."""

    head: ZKey
    handle: Any
    seconds: dict[str, float]  # host QAP, head, points


def qap_columns(data: CircuitData, toxic: ToxicWaste) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u, v, beta u + alpha v + w) at tau, one row per wire, standard form.

    u and v are the column sums of the coded A (its public rows included) and B rows against the
    Lagrange values of the domain, w those of C: what :func:`~.setup.setup` computes from the r1cs.
    """
    if data.c is None:
        raise ValueError("a key needs the circuit's C rows: circuit data built without its r1cs")
    counts = data.counts
    log_n = counts.domain_size.bit_length() - 1
    n_rows = max(data.a.n_rows, data.b.n_rows, data.c.n_rows)
    lag = fr.geometric_ratios(toxic.tau, lagrange_factor(toxic.tau, 1 << log_n), fr_root_of_unity(log_n), 1, n_rows)
    u = coded_sparse.rmatvec(data.a, data.table_mont, lag, counts.n_vars)
    v = coded_sparse.rmatvec(data.b, data.table_mont, lag, counts.n_vars)
    k = coded_sparse.rmatvec(data.c, data.table_mont, lag, counts.n_vars)
    del lag
    fr.add_scaled2_into(k, u, toxic.beta, v, toxic.alpha)
    return u, v, k


def setup_resident(data: CircuitData, backend: Any, toxic: ToxicWaste, *, name: str = "key",
                   witness_map: bool = False) -> ResidentKey:
    """The INSECURE dev key of the circuit of ``data`` with this toxic waste, resident in ``backend``.

    ``backend`` provides ``fixed_base_g1/g2`` (the head) and ``generate_key(head, sections)``.
    ``witness_map``: the key's partitions will come as w alone (the backend's ``stage_witness``
    with these rows), so the backend's memory plan counts its copy of them.
    Logged at INFO: the host QAP, then the backend's own progress.
    """
    counts = data.counts
    log_n = counts.domain_size.bit_length() - 1
    toxic.check(log_n)
    log.warning("%s: %s", name, INSECURE_WARNING)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    u, v, k = qap_columns(data, toxic)
    times["qap_s"] = time.perf_counter() - t0
    log.info("resident setup %s: the QAP at tau in %.1f s (2^%d domain, %d wires)", name, times["qap_s"], log_n,
             counts.n_vars)
    t0 = time.perf_counter()
    n_pub = counts.n_public
    g1, g2 = G1Point(), G2Point()
    head1 = backend.fixed_base_g1(g1, fr.from_ints([toxic.alpha, toxic.beta, toxic.delta], mont=False))
    head2 = backend.fixed_base_g2(g2, fr.from_ints([toxic.beta, 1, toxic.delta], mont=False))
    ic = backend.fixed_base_g1(g1, np.ascontiguousarray(k[: n_pub + 1]))
    none = np.zeros((0, 12), np.uint64)
    head = ZKey(path=name, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=counts.n_vars, n_public=n_pub,
                domain_size=counts.domain_size, alpha1=head1[0], beta1=head1[1], beta2=head2[0], gamma2=head2[1],
                delta1=head1[2], delta2=head2[2], ic=ic, coefs=None,  # type: ignore[arg-type]
                a=none, b1=none, b2=np.zeros((0, 24), np.uint64), c=none, h=none, contributions=empty_contributions())
    times["head_s"] = time.perf_counter() - t0
    d_inv = pow(toxic.delta, -1, R_MOD)
    scalars: dict[str, np.ndarray] = {"u": u, "v": v, "k": k}
    del u, v, k
    sections: SectionScalars = [
        ("a", "g1", lambda: scalars.pop("u")),
        ("b1", "g1", lambda: scalars["v"]),
        ("b2", "g2", lambda: scalars.pop("v")),
        ("c", "g1", lambda: fr.scale(scalars.pop("k")[n_pub + 1 :], d_inv)),
        ("h", "g1", lambda: h_scalars(toxic, log_n)),
    ]
    t0 = time.perf_counter()
    handle = backend.generate_key(head, sections, witness_rows=data if witness_map else None)
    times["points_s"] = time.perf_counter() - t0
    log.info("resident setup %s: the points in %.1f s (QAP %.1f s, head %.1f s)", name, times["points_s"],
             times["qap_s"], times["head_s"])
    return ResidentKey(head, handle, times)
