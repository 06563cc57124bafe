"""snarkjs Groth16 proving keys (``.zkey``, version 1): header, coefficients and point sections.

Layout (snarkjs-formats.md section 5.6; snarkjs ``zkey_utils.js``):

====  ==========================================================================
 1    protocol u32 (1 = Groth16; 2 = PLONK and 10 = FFLONK are refused)
 2    n8q u32, q, n8r u32, r, nVars u32, nPublic u32, domainSize u32, then
      alpha1 G1, beta1 G1, beta2 G2, gamma2 G2, delta1 G1, delta2 G2 (964 bytes)
 3    IC: (nPublic + 1) G1
 4    coefs: nCoefs u32, then nCoefs x {matrix u32, constraint u32, signal u32,
      value 32 bytes = coef * R^2 mod r}  (44 bytes each; A = 0, B = 1)
 5    A: nVars G1        6  B1: nVars G1       7  B2: nVars G2
 8    C: (nVars - nPublic - 1) G1             9  H: domainSize G1
10    contributions: csHash (64 bytes), n u32, n contribution records
====  ==========================================================================

Points are affine Montgomery little-endian ("LEM"): G1 = ``(12,) uint64``
(x then y, 6 limbs each), G2 = ``(24,)`` (x.c0, x.c1, y.c0, y.c1); all zeros is
infinity. This module owns the mapping of the key file: the big arrays of a
:class:`ZKey` are read-only views over it, nothing is copied.

Validation at read: everything the header implies (section sizes, primes,
protocol), the coefficient entries (matrix in {0, 1}, constraint <
domainSize, signal < nVars, value < r) and the header and IC coordinates
(< q). Coordinates of the big point sections are not checked here (that would
read every page of a 10 GB file at open); section 10 must hold at least its
csHash and count, its records are kept as raw bytes.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..algebra.field import FQ, FR, Q_MOD, R_MOD, first_not_below, log2_exact
from ..algebra.sparse import CsrMatrix
from ..errors import FormatError
from .binfile import BinFile, FieldReader, Payload, open_source, write_binfile

MAGIC = "zkey"
VERSION = 1
GROTH16 = 1
PROTOCOL_NAMES = {1: "Groth16", 2: "PLONK", 10: "FFLONK"}
N8Q, N8R = 48, 32
G1_LIMBS, G2_LIMBS = 12, 24
HEADER_BYTES = 4 + N8Q + 4 + N8R + 3 * 4 + 3 * 96 + 3 * 192  # 964
CONTRIBUTIONS_MIN_BYTES = 64 + 4  # csHash + number of contributions
COEF_DTYPE = np.dtype([("matrix", "<u4"), ("constraint", "<u4"), ("signal", "<u4"), ("value", "<u8", (4,))])
assert COEF_DTYPE.itemsize == 44
SECTION_LABELS = {1: "protocol", 2: "header", 3: "IC", 4: "coefs", 5: "A", 6: "B1", 7: "B2",
                  8: "C", 9: "H", 10: "contributions"}
_HEADER_POINTS = (("alpha1", G1_LIMBS), ("beta1", G1_LIMBS), ("beta2", G2_LIMBS),
                  ("gamma2", G2_LIMBS), ("delta1", G1_LIMBS), ("delta2", G2_LIMBS))
HEADER_POINTS = tuple(key for key, _ in _HEADER_POINTS)
SECTION_OF = {**{key: 2 for key in HEADER_POINTS}, "ic": 3, "a": 5, "b1": 6, "b2": 7, "c": 8, "h": 9}  # field -> id


@dataclass(eq=False)
class ZKey:
    """A Groth16 proving key, arrays in the zkey's own layout (LEM points, v R^2 coefs).

    Read from a file, the big arrays (ic, coefs, a, b1, b2, c, h) are
    read-only views over the mapping; :meth:`close` drops them (views taken
    earlier keep the mapping alive until they are gone). For
    :func:`write_zkey` any big array may instead be a list of row chunks or a :class:`ChunkStream`.
    """

    path: str | None
    n8q: int
    q: int
    n8r: int
    r: int
    n_vars: int
    n_public: int
    domain_size: int
    alpha1: np.ndarray  # (12,) uint64
    beta1: np.ndarray  # (12,)
    beta2: np.ndarray  # (24,)
    gamma2: np.ndarray  # (24,)
    delta1: np.ndarray  # (12,)
    delta2: np.ndarray  # (24,)
    ic: np.ndarray  # (n_public + 1, 12): section 3
    coefs: np.ndarray  # (n_coefs,) COEF_DTYPE: section 4
    a: np.ndarray  # (n_vars, 12): section 5
    b1: np.ndarray  # (n_vars, 12): section 6
    b2: np.ndarray  # (n_vars, 24): section 7
    c: np.ndarray  # (n_vars - n_public - 1, 12): section 8
    h: np.ndarray  # (domain_size, 12): section 9
    contributions: bytes  # section 10, raw
    _binfile: BinFile | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def log_domain(self) -> int:
        """log2(domain_size)."""
        return log2_exact(self.domain_size)

    def close(self) -> None:
        """Release the file mapping; the big array fields become None (the key is unusable)."""
        for name in ("ic", "coefs", "a", "b1", "b2", "c", "h"):
            setattr(self, name, None)
        if self._binfile is not None:
            self._binfile.close()
            self._binfile = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        """A key mapped from a file pickles as its path: the receiver maps (and validates) it
        again instead of a multi-GB copy of its arrays crossing the process boundary."""
        if self._binfile is not None and self.path is not None:
            return (read_zkey, (self.path,))
        return super().__reduce_ex__(protocol)

    def __enter__(self) -> ZKey:
        """Context manager: :meth:`close` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the mapping."""
        self.close()


def read_zkey(path: str | os.PathLike[str] | bytes | bytearray | memoryview, *, name: str | None = None,
              check_coefs: bool = True) -> ZKey:
    """Map a .zkey (or parse its bytes) and validate it; FormatError names file, section, field.

    ``check_coefs=False`` leaves out the pass over section 4's entries (matrix, row, signal and
    value ranges; its size is still checked): for a caller that takes the circuit from a cache
    built, and checked, from this same file, and never reads ``coefs`` itself."""
    bf = open_source(path, name, MAGIC, (VERSION,), SECTION_LABELS)
    try:
        zkey = _read(bf, path, check_coefs)
    except BaseException:
        bf.close()
        raise
    zkey._binfile = bf
    return zkey


def _read(bf: BinFile, src: object, check_coefs: bool = True) -> ZKey:
    rd = FieldReader(bf, 1)
    protocol = rd.u32("protocol")
    rd.end()
    if protocol != GROTH16:
        found = PROTOCOL_NAMES.get(protocol, "unknown")
        raise bf.error(1, f"protocol is {protocol} ({found}), only Groth16 (1) is supported")
    head = _read_header(bf)
    n_vars, n_public, n = head["n_vars"], head["n_public"], head["domain_size"]
    arrays: dict[str, Any] = dict(
        ic=bf.section_array(3, "<u8", (n_public + 1, G1_LIMBS)),
        a=bf.section_array(5, "<u8", (n_vars, G1_LIMBS)),
        b1=bf.section_array(6, "<u8", (n_vars, G1_LIMBS)),
        b2=bf.section_array(7, "<u8", (n_vars, G2_LIMBS)),
        c=bf.section_array(8, "<u8", (n_vars - n_public - 1, G1_LIMBS)),
        h=bf.section_array(9, "<u8", (n, G1_LIMBS)),
    )
    if bf.section_size(10) < CONTRIBUTIONS_MIN_BYTES:
        raise bf.error(10, f"size is {bf.section_size(10)} bytes, at least {CONTRIBUTIONS_MIN_BYTES} expected "
                       "(csHash and the number of contributions)")
    _check_coordinates(bf, 3, arrays["ic"])
    return ZKey(
        path=None if isinstance(src, (bytes, bytearray, memoryview)) else os.fspath(src),  # type: ignore[call-overload]
        coefs=_read_coefs(bf, n_vars, n, check_coefs), contributions=bytes(bf.section(10)), **arrays, **head,
    )


def _read_header(bf: BinFile) -> dict[str, Any]:
    rd = FieldReader(bf, 2)
    n8q = rd.u32("n8q")
    if n8q != N8Q:
        raise bf.error(2, f"n8q is {n8q}, expected {N8Q}: not a BLS12-381 key")
    if bf.section_size(2) != HEADER_BYTES:
        raise bf.error(2, f"size is {bf.section_size(2)} bytes, expected {HEADER_BYTES}")
    q = rd.bigint(n8q, "q")
    if q != Q_MOD:
        raise bf.error(2, f"not a BLS12-381 key: q is {q:#x}, expected {Q_MOD:#x}")
    n8r = rd.u32("n8r")
    if n8r != N8R:
        raise bf.error(2, f"n8r is {n8r}, expected {N8R}: not a BLS12-381 key")
    r = rd.bigint(n8r, "r")
    if r != R_MOD:
        raise bf.error(2, f"not a BLS12-381 key: r is {r:#x}, expected {R_MOD:#x}")
    head: dict[str, Any] = dict(n8q=n8q, q=q, n8r=n8r, r=r)
    for key in ("n_vars", "n_public", "domain_size"):
        head[key] = rd.u32(key)
    for key, nlimbs in _HEADER_POINTS:
        head[key] = rd.limbs(nlimbs, key)
        _check_coordinates(bf, 2, head[key].reshape(1, -1), key)
    rd.end()
    n = head["domain_size"]
    if n == 0 or n & (n - 1):
        raise bf.error(2, f"domainSize {n} is not a power of two")
    if head["n_vars"] < head["n_public"] + 1:
        raise bf.error(2, f"nVars {head['n_vars']} < nPublic + 1 = {head['n_public'] + 1}")
    return head


def _check_coordinates(bf: BinFile, sid: int, points: np.ndarray, label: str | None = None) -> None:
    """Every Fq coordinate of ``points`` ((n, 12) or (n, 24) LEM rows) must be < q."""
    coords = np.ascontiguousarray(points, dtype=np.uint64).reshape(-1, 6)
    bad = first_not_below(coords, FQ.limbs)
    if bad >= 0:
        per_point = points.shape[1] // 6
        what = label or f"point {bad // per_point}"
        raise bf.error(sid, f"{what}: coordinate {bad % per_point} is >= q (not a Montgomery Fq element)")


def section_error(zkey: ZKey, field: str, problem: str) -> FormatError:
    """A FormatError naming ``zkey``'s file and the section that holds its point field ``field``
    ("alpha1", "ic", "a", ... "h"): for a point found off its curve or its subgroup where the
    points are used (the format's reader checks sizes and coordinates, not the curve)."""
    sid = SECTION_OF[field]
    return FormatError(zkey.path or "zkey", f"{sid} ({SECTION_LABELS[sid]})", problem)


def _read_coefs(bf: BinFile, n_vars: int, domain_size: int, check: bool = True) -> np.ndarray:
    rd = FieldReader(bf, 4)
    n_coefs = rd.u32("nCoefs")
    coefs = bf.section_array(4, COEF_DTYPE, n_coefs, offset=4)
    if not check:
        return coefs
    from .zkey_kernels import check_coefs  # numba: only where section 4 is checked

    status = check_coefs(coefs["matrix"], coefs["constraint"], coefs["signal"], coefs["value"],
                         domain_size, n_vars, FR.limbs)
    code, i = int(status[0]), int(status[1])
    if code:
        e = coefs[i]
        problem = {
            1: f"matrix is {e['matrix']}, expected 0 (A) or 1 (B)",
            2: f"constraint {e['constraint']} >= domainSize {domain_size}",
            3: f"signal {e['signal']} >= nVars {n_vars}",
            4: "value is >= r (not reduced)",
        }[code]
        raise bf.error(4, f"coefficient {i}: {problem}")
    return coefs


def coef_matrices(zkey: ZKey) -> tuple[CsrMatrix, CsrMatrix]:
    """The A and B matrices of section 4 as CSR (rows = domain rows, cols = n_vars, data = v R^2).

    Entries keep their section order within a row (a stable sort by
    constraint). Built by a counting sort straight from the structured
    array (two sequential passes) rather than :func:`cuzk_mp.algebra.sparse.from_coo`,
    which would first copy each matrix's 44-byte entries out by a mask and
    argsort them: ~10x slower for the tens of millions of entries of a 2^24 key.
    """
    from .zkey_kernels import count_rows, fill_rows  # numba: only where the rows are built

    coefs = zkey.coefs
    m, c, s, v = coefs["matrix"], coefs["constraint"], coefs["signal"], coefs["value"]
    counts = np.zeros((2, zkey.domain_size), dtype=np.int64)
    bad = count_rows(m, c, zkey.domain_size, counts)
    if bad >= 0:
        raise ValueError(f"zkey coefficient {bad}: matrix {m[bad]}, constraint {c[bad]} (domain {zkey.domain_size})")
    if coefs.shape[0] and int(s.max()) >= zkey.n_vars:
        raise ValueError(f"zkey coefficients reference signal {int(s.max())} >= n_vars {zkey.n_vars}")
    indptr = np.zeros((2, zkey.domain_size + 1), dtype=np.int64)
    np.cumsum(counts, axis=1, out=indptr[:, 1:])
    idx = [np.empty(int(indptr[k, -1]), dtype=np.uint32) for k in range(2)]
    data = [np.empty((int(indptr[k, -1]), 4), dtype=np.uint64) for k in range(2)]
    fill_rows(m, c, s, v, indptr, idx[0], idx[1], data[0], data[1])
    return (CsrMatrix(indptr[0], idx[0], data[0], zkey.n_vars),  # rows of indptr are contiguous
            CsrMatrix(indptr[1], idx[1], data[1], zkey.n_vars))


# ---------------------------------------------------------------------- writing


@dataclass
class ChunkStream:
    """A big section made while it is written: its row count known up front, its chunks produced on demand.

    :func:`write_zkey` takes one wherever it takes a list of chunks, and pulls ``chunks`` (an
    iterator, consumed once) as it writes, so the producer need not hold the whole section.
    Each chunk is checked as it passes; a count that comes out different from ``rows`` is a
    ValueError after the fact (the temporary file is removed; nothing is renamed into place).
    """

    rows: int
    chunks: Iterable[np.ndarray]


def _streamed(stream: ChunkStream, label: str, rows: int,
              check: Callable[[int, np.ndarray], None]) -> Iterator[np.ndarray]:
    if stream.rows != rows:
        raise ValueError(f"zkey.{label} stream declares {stream.rows} rows, expected {rows}")

    def chunks() -> Iterator[np.ndarray]:
        total = 0
        for k, chunk in enumerate(stream.chunks):
            check(k, chunk)
            total += chunk.shape[0]
            yield chunk
        if total != rows:
            raise ValueError(f"zkey.{label} stream had {total} rows, expected {rows}")
    return chunks()


def _rows(value: Any, label: str, rows: int, width: int) -> Payload:
    """A big array (or list of row chunks, or a :class:`ChunkStream`) checked to be ``(rows, width)`` uint64."""
    def check(k: int, chunk: np.ndarray) -> None:
        if chunk.dtype != np.uint64 or chunk.ndim != 2 or chunk.shape[1] != width:
            raise ValueError(f"zkey.{label} chunk {k}: expected (n, {width}) uint64, got {chunk.dtype} {chunk.shape}")

    if isinstance(value, ChunkStream):
        return _streamed(value, label, rows, check)
    chunks = [value] if isinstance(value, np.ndarray) else list(value)
    total = 0
    for k, chunk in enumerate(chunks):
        check(k, chunk)
        total += chunk.shape[0]
    if total != rows:
        raise ValueError(f"zkey.{label} has {total} rows, expected {rows}")
    return chunks


def _coef_payload(value: Any) -> Payload:
    def check(k: int, chunk: np.ndarray) -> None:
        if chunk.dtype != COEF_DTYPE or chunk.ndim != 1:
            raise ValueError(f"zkey.coefs chunk {k}: expected a 1-d COEF_DTYPE array, got {chunk.dtype} {chunk.shape}")

    if isinstance(value, ChunkStream):
        return itertools.chain([struct.pack("<I", value.rows)], _streamed(value, "coefs", value.rows, check))
    chunks = [value] if isinstance(value, np.ndarray) else list(value)
    for k, chunk in enumerate(chunks):
        check(k, chunk)
    count = sum(chunk.shape[0] for chunk in chunks)
    return [struct.pack("<I", count), *chunks]


def header_bytes(zkey: ZKey) -> bytes:
    """Section 2 of ``zkey`` (964 bytes)."""
    if (zkey.q, zkey.r, zkey.n8q, zkey.n8r) != (Q_MOD, R_MOD, N8Q, N8R):
        raise ValueError("only BLS12-381 keys (n8q 48, n8r 32, its q and r) can be written")
    parts = [struct.pack("<I", N8Q), Q_MOD.to_bytes(N8Q, "little"), struct.pack("<I", N8R),
             R_MOD.to_bytes(N8R, "little"), struct.pack("<III", zkey.n_vars, zkey.n_public, zkey.domain_size)]
    for key, nlimbs in _HEADER_POINTS:
        point = np.asarray(getattr(zkey, key), dtype="<u8")
        if point.shape != (nlimbs,):
            raise ValueError(f"zkey.{key} has shape {point.shape}, expected ({nlimbs},)")
        parts.append(point.tobytes())
    return b"".join(parts)


def write_zkey(path: str | os.PathLike[str], zkey: ZKey) -> None:
    """Write ``zkey`` as a snarkjs .zkey, sections 1..10 in order, streaming.

    Accepted: ``ic, a, b1, b2, c, h`` as ``(n, 12)`` / ``(n, 24)`` uint64 arrays
    or lists of such row chunks (their rows must add up to what the header
    implies) or :class:`ChunkStream` s of them, made as they are written in
    file order (3, 4, 5, ... 9); ``coefs`` as a COEF_DTYPE array, a list of them or a stream (written in the
    given order: snarkjs sorts them by constraint); ``contributions`` as bytes
    (at least csHash + count; :func:`empty_contributions` makes the minimal one).
    Nothing is concatenated: chunks go to disk one by one.
    """
    write_binfile(path, MAGIC, VERSION, zkey_sections(zkey))


def zkey_sections(zkey: ZKey) -> list[tuple[int, Payload]]:
    """The sections :func:`write_zkey` writes, in file order (its checks first), for a writer that
    has its file open already (:func:`~cuzk_mp.groth16.setup.setup_file`)."""
    log2_exact(zkey.domain_size)
    n_vars, n_public = zkey.n_vars, zkey.n_public
    if n_vars < n_public + 1:
        raise ValueError(f"n_vars {n_vars} < n_public + 1 = {n_public + 1}")
    if len(zkey.contributions) < CONTRIBUTIONS_MIN_BYTES:
        raise ValueError(f"contributions is {len(zkey.contributions)} bytes, at least {CONTRIBUTIONS_MIN_BYTES} needed")
    sections: list[tuple[int, Payload]] = [
        (1, struct.pack("<I", GROTH16)),
        (2, header_bytes(zkey)),
        (3, _rows(zkey.ic, "ic", n_public + 1, G1_LIMBS)),
        (4, _coef_payload(zkey.coefs)),
        (5, _rows(zkey.a, "a", n_vars, G1_LIMBS)),
        (6, _rows(zkey.b1, "b1", n_vars, G1_LIMBS)),
        (7, _rows(zkey.b2, "b2", n_vars, G2_LIMBS)),
        (8, _rows(zkey.c, "c", n_vars - n_public - 1, G1_LIMBS)),
        (9, _rows(zkey.h, "h", zkey.domain_size, G1_LIMBS)),
        (10, bytes(zkey.contributions)),
    ]
    return sections


def empty_contributions(cs_hash: bytes = bytes(64)) -> bytes:
    """Section 10 with no contributions: the 64-byte csHash then a zero count."""
    if len(cs_hash) != 64:
        raise ValueError(f"csHash must be 64 bytes, got {len(cs_hash)}")
    return bytes(cs_hash) + struct.pack("<I", 0)


def coefs_from_arrays(matrix: np.ndarray, constraint: np.ndarray, signal: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Pack parallel arrays (value ``(n, 4)`` uint64, v R^2 form) into a COEF_DTYPE array."""
    out = np.empty(len(matrix), dtype=COEF_DTYPE)
    out["matrix"], out["constraint"], out["signal"], out["value"] = matrix, constraint, signal, value
    return out
