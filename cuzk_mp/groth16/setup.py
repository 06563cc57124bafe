"""Development (INSECURE) Groth16 setup: an R1CS -> a snarkjs-format proving key.

The key is what snarkjs ``groth16 setup`` followed by one ``zkey contribute``
would produce (snarkjs ``zkey_new.js``; snarkjs-formats.md section 5.6), but
with the toxic waste tau, alpha, beta, delta drawn here from the OS CSPRNG and
then dropped instead of coming from a powers-of-tau ceremony. Whoever ran the
setup could have kept them and forge proofs: for development and benchmarks only.

Definitions (n = domainSize, w = Fr.w[log n], L_i = Lagrange basis of the n-domain):

* domain: n = smallest power of two >= nConstraints + nPublic + 1; rows
  nConstraints + s (s = 0..nPublic) get the extra A entry 1 * w[s];
* u_j, v_j, w_j = sum over rows c of A[c, j] L_c(tau), B[c, j] L_c(tau), C[c, j] L_c(tau);
* gamma = 1 (gamma2 = the G2 generator, as in every snarkjs key);
* IC_j = (beta u_j + alpha v_j + w_j) G1 for j <= nPublic (section 3);
* C_j = (beta u_j + alpha v_j + w_j) / delta G1 for j > nPublic (section 8);
* A_j = u_j G1, B1_j = v_j G1, B2_j = v_j G2 (sections 5, 6, 7);
* H_j = L^(2n)_(2j+1)(tau) / delta G1: the odd-index Lagrange basis of the 2n-domain (section 9);
* coefficients (section 4): per constraint its A entries then its B entries in
  r1cs order, then the extra A rows, each value coef * R^2 mod r;
* section 10: csHash all zero, no contributions. snarkjs's csHash is a blake2b of
  the key's points *before* any contribution (delta = 1) plus the tau^i Z(tau) G1
  points; recomputing it would cost about as much as sections 8 and 9 again, and
  nothing on the proving path reads it (``zkey verify`` needs the ptau anyway).

Every scalar vector here is in standard form: a standard-form coefficient or
vector times a Montgomery-form value (one Montgomery multiplication) is the
standard-form product, so the Lagrange values are kept in Montgomery form and
everything derived from them comes out ready to be a fixed-base scalar.
The fixed-base work goes through ``backend.fixed_base_g1/g2`` (numba on the
CPU backend, the GPU backend's kernels otherwise), in chunks of CHUNK_ROWS.

Host steps, all linear in the circuit and parallel over numba's pool: the Lagrange values at
tau and the H scalars (:func:`cuzk_mp.algebra.fr.geometric_ratios`: the powers and one batch
inversion fused); the column sums u, v, w as transposed sparse products
(:meth:`CsrMatrix.rmatvec`: each thread scans every entry and keeps its own column range, so
there is no transposed copy of a matrix and no sort); beta u + alpha v + w in place; the
coefficient section filled row-parallel from the two CSR row pointers (:mod:`.setup_kernels`).

Progress goes through logging (so JSON log lines stay JSON): each host step logs its start
and its time; :class:`ProgressLog` weighs each
chunk by its group's cost (a G2 row counts G2_WEIGHT G1 rows) and logs the done fraction, the
rate and the ETA at most every ``interval_s``; every section of 2^20 rows or more goes in at
least four chunks, so a 2^20 key moves about 20 times.

Memory: ``setup`` returns every section in host memory (about 47 GB of points at 2^26);
``setup_file`` makes the sections in file order while ``write_zkey`` writes them
(:class:`~cuzk_mp.formats.zkey.ChunkStream`), so beyond the r1cs it holds the three QAP
scalar vectors (shrinking as sections finish) and one chunk of points or coefficients.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ..algebra import fr
from ..algebra.field import FR, FR_TWO_ADICITY, Q_MOD, R_MOD, domain_log_size, fr_root_of_unity, int_to_limbs
from ..algebra.sparse import CsrMatrix
from ..backends.base import G2_ROW_COST
from ..errors import InputError
from ..logs import duration_text, fmt_bytes
from ..formats.r1cs import R1CS, read_r1cs
from ..formats.atomic import atomic_output
from ..formats.binfile import write_sections
from ..formats.zkey import MAGIC as ZKEY_MAGIC
from ..formats.zkey import VERSION as ZKEY_VERSION
from ..formats.zkey import COEF_DTYPE, ChunkStream, ZKey, coefs_from_arrays, empty_contributions, zkey_sections

log = logging.getLogger("cuzk_mp.groth16.setup")
_R2_LIMBS = int_to_limbs(FR.r2, 4)  # the coefficient 1 in v R^2 form
_R3_LIMBS = int_to_limbs(FR.to_mont_int(FR.r2), 4)  # R^3 mod r: a Montgomery product with it takes v to v R^2

# Fixed-base rows per backend call, which is the unit of progress: a section of n rows goes in
# n/4 pieces, but never smaller than MIN_CHUNK_ROWS nor larger than CHUNK_ROWS. Each call rebuilds
# its window table (2^15 additions per window, against 2^18 or 2^20 rows), so a 2^20 key pays up
# to ~12% for moving four times per section, and keys of 2^22 and more nothing extra
# (perf/setup_chunks.py: 2^20 G1 rows in four calls took 4% longer than in one, 2 idle cores).
CHUNK_ROWS = 1 << 20
MIN_CHUNK_ROWS = 1 << 18
PROGRESS_CHUNKS = 4
G2_WEIGHT = G2_ROW_COST  # what a G2 fixed-base row costs in G1 rows, for the rate and ETA
COEF_CHUNK_ROWS = 1 << 20  # constraints per coefficient chunk when the section is streamed (~170 MB)
PROGRESS_INTERVAL_S = 10.0  # at most one progress line per this many seconds
Progress = Callable[[str, int, int], None]  # (section label, rows done, rows in the section)
INSECURE_WARNING = ("INSECURE development setup: the toxic waste (tau, alpha, beta, delta) was random and is "
                    "now discarded, but whoever ran this could have kept it and forge proofs. "
                    "Use this key for development and benchmarks only.")


@dataclass(frozen=True)
class ToxicWaste:
    """The setup's secrets. Tests pass known values; ``fresh`` draws them from the OS CSPRNG."""

    tau: int
    alpha: int
    beta: int
    delta: int

    @classmethod
    def fresh(cls, log_n: int) -> ToxicWaste:
        """Uniform nonzero secrets; tau is redrawn while it lies in the 2n-domain (tau^(2n) = 1)."""
        draw = lambda: 1 + secrets.randbelow(R_MOD - 1)  # noqa: E731
        tau = draw()
        while pow(tau, 2 << log_n, R_MOD) == 1:
            tau = draw()
        return cls(tau=tau, alpha=draw(), beta=draw(), delta=draw())

    def check(self, log_n: int) -> None:
        """ValueError when a secret is 0 (mod r) or tau is a 2n-th root of unity."""
        for name in ("tau", "alpha", "beta", "delta"):
            if getattr(self, name) % R_MOD == 0:
                raise ValueError(f"toxic waste: {name} is 0 mod r")
        if pow(self.tau, 2 << log_n, R_MOD) == 1:
            raise ValueError(f"toxic waste: tau is a 2^{log_n + 1}-th root of unity (Lagrange values undefined)")


def setup(r1cs: R1CS, backend: Any, *, progress: Progress | None = None, toxic: ToxicWaste | None = None,
          name: str = "key") -> ZKey:
    """The Groth16 proving key of ``r1cs`` with random toxic waste (``toxic``: for tests only).

    ``backend`` provides ``fixed_base_g1(G1Point, scalars) -> (n, 12)`` and
    ``fixed_base_g2(G2Point, scalars) -> (n, 24)``. The returned key's big
    sections are lists of row chunks, as :func:`cuzk_mp.formats.zkey.write_zkey` accepts.
    The host steps are logged (INFO) under ``name``.
    """
    return _key(r1cs, backend, progress or (lambda label, done, total: None), toxic, name, stream=False)


def setup_file(r1cs_path: str | os.PathLike[str], zkey_path: str | os.PathLike[str], backend: Any,
               *, progress: Progress | None = None, toxic: ToxicWaste | None = None) -> None:
    """``cuzk-mp setup``: read an .r1cs, make its INSECURE dev key, write the .zkey (atomically).

    Warns (logging) that the key is insecure; without ``progress``, a :class:`ProgressLog`
    reports at INFO (fraction, rate, ETA), then one line when the key is written. Sections
    are made while they are written (file order), so the host holds the QAP scalars and one
    chunk of points or coefficients, never a whole section; the file is byte-identical to
    ``write_zkey(setup(...))`` for the same toxic waste (``toxic``: for tests only).
    """
    t0 = time.perf_counter()
    # the key's place is taken first: a path that cannot be written is refused before the r1cs is
    # read and the QAP made (minutes at 2^27), and a failure anywhere after leaves nothing there
    with atomic_output(zkey_path) as out:
        log.warning("%s: %s", os.fspath(zkey_path), INSECURE_WARNING)
        r1cs = _host_step(os.fspath(zkey_path), f"reading {os.fspath(r1cs_path)}", lambda: read_r1cs(r1cs_path))
        log_n = _domain_log(r1cs)
        _check_room(r1cs, os.fspath(r1cs_path), os.fspath(zkey_path))
        name = f"{os.fspath(zkey_path)} (2^{log_n} domain, {r1cs.n_wires} wires)"
        log.info("setup %s: the QAP at tau, then %d fixed-base points", name,
                 sum(rows for rows, _ in section_rows(r1cs).values()))
        report = progress or ProgressLog(name, section_rows(r1cs))
        write_sections(out, ZKEY_MAGIC, ZKEY_VERSION, zkey_sections(_key(r1cs, backend, report, toxic, name,
                                                                          stream=True)))
    log.info("setup %s: written in %.1f s", name, time.perf_counter() - t0)


def _key(r1cs: R1CS, backend: Any, report: Progress, toxic: ToxicWaste | None, name: str, *, stream: bool) -> ZKey:
    """The key's sections in file order: lists of chunks, or (``stream``) :class:`ChunkStream` s made
    while ``write_zkey`` writes them; each stream drops the scalars it was the last to need."""
    log_n = _domain_log(r1cs)
    toxic = toxic or ToxicWaste.fresh(log_n)
    toxic.check(log_n)
    n_public, n_vars = r1cs.n_public, r1cs.n_wires
    u, v, k = _host_step(name, "the QAP at tau", lambda: _qap_columns(r1cs, toxic, log_n))
    scalars = {"u": u, "v": v, "k": k}
    del u, v, k
    g1, g2 = G1Point(), G2Point()
    head1 = backend.fixed_base_g1(g1, fr.from_ints([toxic.alpha, toxic.beta, toxic.delta], mont=False))
    head2 = backend.fixed_base_g2(g2, fr.from_ints([toxic.beta, 1, toxic.delta], mont=False))
    d_inv = pow(toxic.delta, -1, R_MOD)

    def points(fn: Callable[[Any, np.ndarray], np.ndarray], base: Any, label: str,
               take: Callable[[], np.ndarray]) -> ChunkStream | list[np.ndarray]:
        chunks = _fixed_base_chunks(fn, base, take, label, report)
        return ChunkStream(section_rows(r1cs)[label][0], chunks) if stream else list(chunks)

    # built in file order (sections 3, 4, 5, 6, 7, 8, 9): in the eager case each list is made here
    ic = points(backend.fixed_base_g1, g1, "IC", lambda: scalars["k"][: n_public + 1])
    n_coefs = r1cs.a.nnz + r1cs.b.nnz + n_public + 1
    coefs: ChunkStream | np.ndarray = (ChunkStream(n_coefs, _logged_coef_chunks(r1cs, name)) if stream else
                                       _host_step(name, "the coefficient section", lambda: snarkjs_coefs(r1cs)))
    a = points(backend.fixed_base_g1, g1, "A", lambda: scalars.pop("u"))
    b1 = points(backend.fixed_base_g1, g1, "B1", lambda: scalars["v"])
    b2 = points(backend.fixed_base_g2, g2, "B2", lambda: scalars.pop("v"))
    c = points(backend.fixed_base_g1, g1, "C", lambda: fr.scale(scalars.pop("k")[n_public + 1 :], d_inv))
    h = points(backend.fixed_base_g1, g1, "H", lambda: _host_step(name, "the H scalars",
                                                                   lambda: h_scalars(toxic, log_n)))
    # the big sections are chunk lists or streams, which write_zkey accepts (ZKey's fields name the read form)
    return ZKey(
        path=None, n8q=48, q=Q_MOD, n8r=32, r=R_MOD, n_vars=n_vars, n_public=n_public, domain_size=1 << log_n,
        alpha1=head1[0], beta1=head1[1], beta2=head2[0], gamma2=head2[1], delta1=head1[2], delta2=head2[2],
        coefs=coefs, contributions=empty_contributions(),  # type: ignore[arg-type]
        ic=ic, a=a, b1=b1, b2=b2, c=c, h=h,  # type: ignore[arg-type]
    )


_T = TypeVar("_T")


def _host_step(name: str, what: str, fn: Callable[[], _T]) -> _T:
    """``fn()``, logged at INFO when it starts and with its time when done (a long setup is never silent)."""
    log.info("setup %s: %s ...", name, what)
    t0 = time.perf_counter()
    out = fn()
    log.info("setup %s: %s in %.1f s", name, what, time.perf_counter() - t0)
    return out


# Host bytes a wire takes in the setup at its peak (its A, B, C values at tau and the running sums:
# four Fr a wire), and key bytes it adds (its A, B1, B2 and C points).
SETUP_HOST_BYTES_PER_WIRE = 4 * 32
KEY_BYTES_PER_WIRE = 96 + 96 + 192 + 96


def _check_room(r1cs: R1CS, r1cs_name: str, zkey_name: str) -> None:
    """ResourceError, before any work, where the r1cs's wire count needs more memory than is available
    or a bigger key than its folder's file system holds: the count is the file's word (nothing else in
    an r1cs without its optional label map bounds it), and 2^32 wires would be a 128 GiB allocation."""
    import shutil

    from ..errors import ResourceError

    check_memory(r1cs.n_wires * SETUP_HOST_BYTES_PER_WIRE, f"{r1cs_name}: {r1cs.n_wires} wires need", " in the setup")
    key = r1cs.n_wires * KEY_BYTES_PER_WIRE + (1 << _domain_log(r1cs)) * 96
    folder = os.path.dirname(os.path.abspath(zkey_name))
    free = shutil.disk_usage(folder).free if os.path.isdir(folder) else None
    if free is not None and key > free:
        raise ResourceError(f"{zkey_name}: the key of {r1cs.n_wires} wires takes ~{fmt_bytes(key)}; "
                            f"{fmt_bytes(free)} are free on its file system")


def check_memory(need: int, subject: str, where: str = "", advice: str = "") -> None:
    """ResourceError where ``need`` bytes are more than the memory available now: checked before a
    build whose size a file or an option sets (the setup of an r1cs, a synthetic circuit's r1cs and
    circuit data), which would otherwise grow until the kernel's OOM killer ends it, or another
    process of the machine, minutes later. The message: "``subject`` ~N GiB of memory``where``; M GiB
    are available``advice``" (each size in the unit that shows it: KiB, MiB or GiB)."""
    import psutil

    from ..errors import ResourceError

    available = int(psutil.virtual_memory().available)
    if need > available:
        raise ResourceError(f"{subject} ~{fmt_bytes(need)} of memory{where}; {fmt_bytes(available)} "
                            f"are available{advice}")


def section_rows(r1cs: R1CS) -> dict[str, tuple[int, int]]:
    """Each fixed-base section of the key: label -> (rows, cost weight of one row)."""
    n_pub, n_vars = r1cs.n_public, r1cs.n_wires
    return {"IC": (n_pub + 1, 1), "C": (n_vars - n_pub - 1, 1), "A": (n_vars, 1), "B1": (n_vars, 1),
            "B2": (n_vars, G2_WEIGHT), "H": (1 << _domain_log(r1cs), 1)}


class ProgressLog:
    """A :data:`Progress` that logs the whole setup's done fraction, rate and ETA.

    ``sections`` is :func:`section_rows`. The clock starts at the first report (the first
    section's 0 rows done, after the QAP), so the rate is the fixed-base rate (when ``setup_file``
    streams, it includes the coefficient section's few seconds, made between IC and A); a line is logged
    at most every ``interval_s`` and once when every section is done.
    """

    def __init__(self, name: str, sections: dict[str, tuple[int, int]], *, interval_s: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.weights = {label: weight for label, (_, weight) in sections.items()}
        self.total = sum(rows * weight for rows, weight in sections.values())
        self.interval_s = interval_s
        self.clock = clock
        self.done_rows: dict[str, int] = {}
        self.work = 0  # weighted rows done
        self.t0: float | None = None
        self.last = 0.0

    def __call__(self, label: str, done: int, total: int) -> None:
        """One report of ``setup``: ``done`` of the ``total`` rows of section ``label``."""
        now = self.clock()
        if self.t0 is None:
            self.t0 = self.last = now
        self.work += (done - self.done_rows.get(label, 0)) * self.weights[label]
        self.done_rows[label] = done
        finished = self.work >= self.total
        if not finished and (done == 0 or now - self.last < self.interval_s):
            return
        self.last = now
        elapsed = now - self.t0
        rate = self.work / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.work) / rate if rate > 0 else float("inf")
        log.info("setup %s: %.0f%% (section %s %d/%d rows), %.0f G1-rows/s, %s elapsed, ETA %s", self.name,
                 100.0 * self.work / max(self.total, 1), label, done, total, rate, duration_text(elapsed),
                 duration_text(eta))


def _domain_log(r1cs: R1CS) -> int:
    """log2 of the domain (snarkjs ``cirPower``); InputError when Fr has no such root of unity."""
    log_n = domain_log_size(r1cs.n_constraints + r1cs.n_public + 1)
    if log_n >= FR_TWO_ADICITY:  # H needs the 2n-th roots of unity
        raise InputError(f"{r1cs.path or 'r1cs'}: {r1cs.n_constraints} constraints need a 2^{log_n} domain; "
                         f"BLS12-381's Fr supports at most 2^{FR_TWO_ADICITY - 1} for Groth16")
    return log_n


def _fixed_base(fn: Callable[[Any, np.ndarray], np.ndarray], base: Any, scalars: np.ndarray, label: str,
                report: Progress) -> list[np.ndarray]:
    """fn(base, scalars) in :func:`chunk_rows` pieces, reporting the start and each piece (the section)."""
    return list(_fixed_base_chunks(fn, base, lambda: scalars, label, report))


def _fixed_base_chunks(fn: Callable[[Any, np.ndarray], np.ndarray], base: Any, take: Callable[[], np.ndarray],
                       label: str, report: Progress) -> Iterator[np.ndarray]:
    """The chunks of :func:`_fixed_base` one at a time; ``take()`` gives the scalars when the first is asked for."""
    scalars = take()
    n = scalars.shape[0]
    step = chunk_rows(n)
    report(label, 0, n)
    for lo in range(0, n, step):
        yield fn(base, np.ascontiguousarray(scalars[lo : lo + step]))
        report(label, min(n, lo + step), n)
    if n == 0:
        yield fn(base, scalars)


def chunk_rows(n: int) -> int:
    """Rows per fixed-base call for a section of ``n`` rows (see CHUNK_ROWS): a power of two."""
    quarter = 1 << max(0, (n // PROGRESS_CHUNKS).bit_length() - 1)
    return max(MIN_CHUNK_ROWS, min(CHUNK_ROWS, quarter))


def lagrange_values(tau: int, size: int, xs: np.ndarray) -> np.ndarray:
    """L_x(tau) for points x (Montgomery ``(m, 4)``) of the ``size``-point domain, Montgomery form.

    L_x(tau) = (tau^size - 1) / size * x / (tau - x)  (Z(X) = X^size - 1, Z'(x) = size / x).
    For points w^i the setup uses :func:`cuzk_mp.algebra.fr.geometric_ratios`, the same values fused.
    """
    ratio = fr.batch_inverse(fr.scalar_sub(tau, xs))
    fr.mul_into(ratio, xs, ratio)
    return fr.scale(ratio, lagrange_factor(tau, size))


def lagrange_factor(tau: int, size: int) -> int:
    """(tau^size - 1) / size: the factor every Lagrange value of the ``size``-point domain shares."""
    return (pow(tau, size, R_MOD) - 1) * pow(size, -1, R_MOD) % R_MOD


def _column_sums(m: CsrMatrix, lag: np.ndarray) -> np.ndarray:
    """sum_c M[c, j] lag[c] for every column j: standard-form (n_cols, 4) (standard M x Montgomery lag)."""
    return m.rmatvec(lag)


def _qap_columns(r1cs: R1CS, toxic: ToxicWaste, log_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u, v, beta u + alpha v + w) at tau, one row per wire, standard form."""
    n_rows = r1cs.n_constraints + r1cs.n_public + 1
    lag = fr.geometric_ratios(toxic.tau, lagrange_factor(toxic.tau, 1 << log_n), fr_root_of_unity(log_n), 1, n_rows)
    u = _column_sums(r1cs.a, lag)
    extra = fr.from_mont(lag[r1cs.n_constraints :])  # the extra rows: A[nC + s, s] = 1
    u[: r1cs.n_public + 1] = fr.add(u[: r1cs.n_public + 1], extra)
    v = _column_sums(r1cs.b, lag)
    k = _column_sums(r1cs.c, lag)
    del lag
    fr.add_scaled2_into(k, u, toxic.beta, v, toxic.alpha)
    return u, v, k


def h_scalars(toxic: ToxicWaste, log_n: int) -> np.ndarray:
    """L^(2n)_(2j+1)(tau) / delta for j < n, standard form (the odd points are w_2n * w_n^j)."""
    n = 1 << log_n
    factor = lagrange_factor(toxic.tau, 2 * n) * pow(toxic.delta, -1, R_MOD)
    return fr.geometric_ratios(toxic.tau, factor, fr_root_of_unity(log_n), fr_root_of_unity(log_n + 1), n, mont=False)


def snarkjs_coefs(r1cs: R1CS) -> np.ndarray:
    """Section 4 in snarkjs order: per constraint its A then its B entries, then the extra A rows.

    Values are coef * R^2 mod r. Entries keep their r1cs order within a row; where each row's
    entries go follows from the two row pointers (:func:`.setup_kernels.fill_coefs`), so no sort
    is needed.
    """
    n_ab = r1cs.a.nnz + r1cs.b.nnz
    out = np.empty(n_ab + r1cs.n_public + 1, dtype=COEF_DTYPE)
    _fill(r1cs, 0, r1cs.n_constraints, out[:n_ab])
    out[n_ab:] = _public_coefs(r1cs)
    return out


def coef_chunks(r1cs: R1CS, rows: int | None = None) -> Iterator[np.ndarray]:
    """:func:`snarkjs_coefs` in pieces of ``rows`` constraints (default COEF_CHUNK_ROWS), then the extra
    A rows: one host chunk at a time."""
    a, b = r1cs.a, r1cs.b
    step = max(1, rows or COEF_CHUNK_ROWS)
    for lo in range(0, r1cs.n_constraints, step):
        hi = min(r1cs.n_constraints, lo + step)
        out = np.empty(int(a.indptr[hi] - a.indptr[lo] + b.indptr[hi] - b.indptr[lo]), dtype=COEF_DTYPE)
        _fill(r1cs, lo, hi, out)
        yield out
    yield _public_coefs(r1cs)


def _fill(r1cs: R1CS, lo: int, hi: int, out: np.ndarray) -> None:
    a, b = r1cs.a, r1cs.b
    from .setup_kernels import fill_coefs  # numba: a setup's own (the prover never writes section 4)

    fill_coefs(a.indptr, a.indices, np.ascontiguousarray(a.data), b.indptr, b.indices, np.ascontiguousarray(b.data),
               lo, hi, _R3_LIMBS, out["matrix"], out["constraint"], out["signal"], out["value"])


def _public_coefs(r1cs: R1CS) -> np.ndarray:
    """The extra A rows: A[nC + s, s] = 1 for s = 0 .. nPublic."""
    n_pub = r1cs.n_public
    publics = np.arange(n_pub + 1, dtype=np.uint32)
    one_r2 = np.broadcast_to(_R2_LIMBS, (n_pub + 1, 4))  # the coefficient 1, times R^2
    return coefs_from_arrays(np.zeros(n_pub + 1, np.uint32), r1cs.n_constraints + publics, publics, one_r2)


def _logged_coef_chunks(r1cs: R1CS, name: str) -> Iterator[np.ndarray]:
    """:func:`coef_chunks`, logged as one host step (its start, and its time without the writing)."""
    log.info("setup %s: the coefficient section ...", name)
    busy = 0.0
    chunks = coef_chunks(r1cs)
    while True:
        t0 = time.perf_counter()
        chunk = next(chunks, None)
        busy += time.perf_counter() - t0
        if chunk is None:
            break
        yield chunk
    log.info("setup %s: the coefficient section in %.1f s", name, busy)
