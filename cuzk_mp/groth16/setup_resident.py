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
from .circuit_data_file import CircuitData
from .setup import ToxicWaste, h_scalars, lagrange_factor

log = logging.getLogger("cuzk_mp.groth16.setup_resident")

# Sections in the order generate_key receives them: name, group, scalars.
SectionScalars = list[tuple[str, str, Callable[[], np.ndarray]]]


@dataclass
class ResidentKey:
    """A generated key: its head (a :class:`ZKey` without coefficient and point sections) and the
    backend's handle of the resident points."""

    head: ZKey
    handle: Any
    seconds: dict[str, float]  # head_s, points_s (the sections), qap_s (the host QAP work inside points_s)


def qap_columns(data: CircuitData, toxic: ToxicWaste) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u, v, beta u + alpha v + w) at tau, one row per wire, standard form.

    u and v are the column sums of the coded A (its public rows included) and B rows against the
    Lagrange values of the domain, w those of C: what :func:`~.setup.setup` computes from the r1cs.
    """
    qap = _Qap(data, toxic)
    return qap.u(), qap.v(), qap.k()


class _Qap:
    """The QAP columns at tau made one at a time, on demand (:func:`setup_resident` hands them to the
    backend as each section's scalars, so the host makes the next while the device turns the last
    into points): the Lagrange values first, kept for the three column sums; u and v kept for k."""

    def __init__(self, data: CircuitData, toxic: ToxicWaste) -> None:
        if data.c is None:
            raise ValueError("a key needs the circuit's C rows: circuit data built without its r1cs")
        self.data, self.toxic = data, toxic
        self._lag: np.ndarray | None = None
        self._u: np.ndarray | None = None
        self._v: np.ndarray | None = None
        self.seconds = 0.0  # host seconds spent in the columns so far

    def _sums(self, m: coded_sparse.CodedMatrix) -> np.ndarray:
        t0 = time.perf_counter()
        counts = self.data.counts
        if self._lag is None:
            log_n = counts.domain_size.bit_length() - 1
            n_rows = max(self.data.a.n_rows, self.data.b.n_rows, self.data.c.n_rows)  # type: ignore[union-attr]
            self._lag = fr.geometric_ratios(self.toxic.tau, lagrange_factor(self.toxic.tau, 1 << log_n),
                                            fr_root_of_unity(log_n), 1, n_rows)
        out = coded_sparse.rmatvec(m, self.data.table_mont, self._lag, counts.n_vars)
        self.seconds += time.perf_counter() - t0
        return out

    def u(self) -> np.ndarray:
        """A's column sums (kept for :meth:`k`)."""
        if self._u is None:
            self._u = self._sums(self.data.a)
        return self._u

    def v(self) -> np.ndarray:
        """B's column sums (kept for :meth:`k`)."""
        if self._v is None:
            self._v = self._sums(self.data.b)
        return self._v

    def k(self) -> np.ndarray:
        """beta u + alpha v + C's column sums; the Lagrange values, u and v are let go."""
        u, v = self.u(), self.v()
        k = self._sums(self.data.c)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        fr.add_scaled2_into(k, u, self.toxic.beta, v, self.toxic.alpha)
        self.seconds += time.perf_counter() - t0
        self._lag = self._u = self._v = None
        return k


KEPT_TOXIC_WARNING = ("INSECURE development key: made from toxic waste (tau, alpha, beta, delta) that is kept "
                      "so that every prover makes the same key (the pipeline keeps it in its param cache as "
                      "<kind>-<log_n>.device.toxic, readable by its owner only): whoever reads it can forge "
                      "proofs. Use this key for development and benchmarks only.")


def setup_resident(data: CircuitData, backend: Any, toxic: ToxicWaste, *, name: str = "key",
                   witness_map: bool = False, batch: int = 1) -> ResidentKey:
    """The INSECURE dev key of the circuit of ``data`` with this toxic waste, resident in ``backend``.

    ``backend`` provides ``fixed_base_g1/g2`` (the head) and ``generate_key(head, sections)``.
    ``witness_map``: the key's partitions will come as w alone (the backend's ``stage_witness``
    with these rows), so the backend's memory plan counts its copy of them. ``batch``: the most of its
    partitions a prover worker stages together (``generate_key``'s, for the backend's memory plan).
    Logged at INFO: the backend's progress per section, then the key's seconds and the QAP's host share.
    """
    counts = data.counts
    log_n = counts.domain_size.bit_length() - 1
    toxic.check(log_n)
    log.warning("%s: %s", name, KEPT_TOXIC_WARNING)
    times: dict[str, float] = {}
    qap = _Qap(data, toxic)
    t0 = time.perf_counter()
    n_pub = counts.n_public
    g1, g2 = G1Point(), G2Point()
    head1 = backend.fixed_base_g1(g1, fr.from_ints([toxic.alpha, toxic.beta, toxic.delta], mont=False))
    head2 = backend.fixed_base_g2(g2, fr.from_ints([toxic.beta, 1, toxic.delta], mont=False))
    none = np.zeros((0, 12), np.uint64)
    head = ZKey(path=name, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=counts.n_vars, n_public=n_pub,
                domain_size=counts.domain_size, alpha1=head1[0], beta1=head1[1], beta2=head2[0], gamma2=head2[1],
                delta1=head1[2], delta2=head2[2], ic=np.zeros((n_pub + 1, 12), np.uint64),
                coefs=None,  # type: ignore[arg-type]
                a=none, b1=none, b2=np.zeros((0, 24), np.uint64), c=none, h=none, contributions=empty_contributions())
    times["head_s"] = time.perf_counter() - t0
    d_inv = pow(toxic.delta, -1, R_MOD)

    def c_scalars() -> np.ndarray:
        # k's public rows make IC (set here: the backend copies the head once every section is made)
        k = qap.k()
        head.ic = backend.fixed_base_g1(g1, np.ascontiguousarray(k[: n_pub + 1]))
        return fr.scale(k[n_pub + 1 :], d_inv)

    # H first (it needs no QAP column), then B2, B1, A, C: the backend makes the sections' scalars
    # ahead of their points, so the host's QAP runs beside the device's kernels; B2's points (G2) take
    # the device longest and B1 takes the same column, so the host makes A's and C's columns meanwhile.
    sections: SectionScalars = [
        ("h", "g1", lambda: h_scalars(toxic, log_n)),
        ("b2", "g2", qap.v),
        ("b1", "g1", qap.v),
        ("a", "g1", qap.u),
        ("c", "g1", c_scalars),
    ]
    t0 = time.perf_counter()
    handle = backend.generate_key(head, sections, witness_rows=data if witness_map else None, batch=batch)
    times["points_s"] = time.perf_counter() - t0
    times["qap_s"] = qap.seconds
    log.info("resident setup %s: the key in %.1f s (the QAP columns' host work %.1f s of it, beside the "
             "device's; head %.1f s)", name, times["points_s"], times["qap_s"], times["head_s"])
    return ResidentKey(head, handle, times)
