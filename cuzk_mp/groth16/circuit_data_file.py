"""The circuit-data cache file: its layout, its header, the identities of the files it was made
from, and every check a file passes before a kernel reads it.

Why a module of its own: what a file on disk must be (and what a damaged, stale or hand-made one
is refused for) is one contract, read by every worker that maps a cache and by the tests that
forge files; :mod:`.circuit_data` builds the files and decides where they live.

The file (``<key>.synth-abc`` with the r1cs's C rows, ``<key>.synth-ab`` without):

* a 4096-byte header: magic, version, a CRC of the header, the file size, a hash of the body
  (:func:`body_hash`),
  the identity of the key (size, mtime in ns, a digest of its header section, whose points
  differ for every setup) and of the r1cs (size, mtime, a digest of its header section), the
  circuit's sizes and each matrix's row and entry counts;
* the body, every array 64-byte aligned in this order: table (v R), table (v R^2), then for A,
  B and C: row pointers, columns, codes. Offsets follow from the counts alone.

Opening (:func:`open_cache`) checks the header, the key's identity, the counts against the key's
own (:class:`CircuitShape`: wires, public signals, domain and the r1cs's constraints, read from
their headers; an identity can be copied into a file made by hand), the size the counts imply and
the body hash, then what the kernels index with (:func:`_check_body`: row pointers that rise from
0 to the entry count, columns below the wire count, codes below the table's size, canonical table
values): a file with the right hash made by hand, or by another program, must not make a kernel
read outside its arrays. Any defect is a FormatError naming the file and the defect
(:class:`StaleCache` where the file is sound but made from other files, or by a release of another
format version: an upgrade or a rollback finds those beside every key).

Decisions: the key's identity is its size, mtime and header digest, not a hash of section 4
(that would read gigabytes at every open): a key rewritten in place with the same size, mtime
and header keeps its cache.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..algebra import fr
from ..algebra.coded_sparse import MAX_ENTRIES, CodedMatrix, code_dtype
from ..algebra.field import domain_log_size
from ..errors import FormatError, InputError
from ..formats.binfile import read_sections
from ..formats.r1cs import MAGIC as R1CS_MAGIC
from ..formats.r1cs import SECTION_LABELS as R1CS_LABELS
from ..formats.r1cs import VERSION as R1CS_VERSION
from ..formats.r1cs import read_r1cs_header
from ..formats.zkey import MAGIC as ZKEY_MAGIC
from ..formats.zkey import SECTION_LABELS as ZKEY_LABELS
from ..formats.zkey import VERSION as ZKEY_VERSION
from ..formats.zkey import read_zkey

MAGIC = b"CUZKSYNT"
VERSION = 3  # 3: A and B checked against the r1cs at the build; 2: the body hash is SHA-256 over 16 MiB blocks
HEADER_BYTES = 4096
ALIGN = 64
HASH_BLOCK_BYTES = 16 << 20
CHECK_CHUNK = 1 << 22  # row pointers compared at a time while a file is checked (bounded scratch)
_HEAD = struct.Struct("<8sII QQ QQ16s QQ16s II QQQQQ QQQQQQ")
_CRC_AT = 12  # byte offset of the header CRC (zeroed while it is computed)


@dataclass(frozen=True)
class FileIdentity:
    """What a cache records of a source file: size, mtime (ns) and a digest of its header section."""

    size: int
    mtime_ns: int
    digest: bytes

    @classmethod
    def none(cls) -> FileIdentity:
        """The identity of an absent file (an in-memory key, no r1cs)."""
        return cls(0, 0, bytes(16))


@dataclass(frozen=True)
class Counts:
    """The sizes that fix a cache file's layout."""

    has_c: bool
    code_bytes: int
    n_vars: int
    n_public: int
    domain_size: int
    n_constraints: int  # rows of C (0 without the r1cs)
    n_codes: int
    a_rows: int
    a_nnz: int
    b_rows: int
    b_nnz: int
    c_rows: int
    c_nnz: int

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of every body array, in file order."""
        codes = np.dtype(f"<u{self.code_bytes}")
        out: list[tuple[str, np.dtype, tuple[int, ...]]] = [
            ("table_mont", np.dtype("<u8"), (self.n_codes, 4)), ("table_r2", np.dtype("<u8"), (self.n_codes, 4))]
        mats = [("a", self.a_rows, self.a_nnz), ("b", self.b_rows, self.b_nnz)]
        if self.has_c:
            mats.append(("c", self.c_rows, self.c_nnz))
        for name, rows, nnz in mats:
            out += [(f"{name}_ptr", np.dtype("<u4"), (rows + 1,)),
                    (f"{name}_col", np.dtype("<u4"), (nnz,)), (f"{name}_code", codes, (nnz,))]
        return out

    def layout(self) -> tuple[dict[str, tuple[int, np.dtype, tuple[int, ...]]], int]:
        """({name: (offset, dtype, shape)}, file size): arrays 64-byte aligned after the header."""
        pos, out = HEADER_BYTES, {}
        for name, dt, shape in self.arrays():
            out[name] = (pos, dt, shape)
            pos += -(-math.prod(shape) * dt.itemsize // ALIGN) * ALIGN  # Python ints: a header's counts never wrap
        return out, pos

    def problem(self) -> str | None:
        """What makes these counts impossible for a file this module writes (None if nothing): a
        header with a valid checksum may still be hand-made."""
        if self.domain_size < 1 or self.domain_size & (self.domain_size - 1):
            return f"domain size {self.domain_size} is not a power of two"
        if not 0 <= self.n_public < self.n_vars:
            return f"{self.n_vars} wires with {self.n_public} public"
        if not 2 <= self.n_codes <= 1 << 32 or code_dtype(self.n_codes).itemsize != self.code_bytes:
            return f"{self.n_codes} distinct coefficients with {self.code_bytes}-byte codes"
        if not self.has_c and (self.n_constraints or self.c_rows or self.c_nnz):
            return "C counts in a file without C rows"
        if self.has_c and self.c_rows != self.n_constraints:
            return f"C has {self.c_rows} rows, the circuit {self.n_constraints} constraints"
        for name, rows, nnz in (("A", self.a_rows, self.a_nnz), ("B", self.b_rows, self.b_nnz),
                                ("C", self.c_rows, self.c_nnz)):
            if rows > self.domain_size:
                return f"{name} has {rows} rows, more than the domain of {self.domain_size}"
            if nnz > MAX_ENTRIES:
                return f"{name} has {nnz} entries, more than the {MAX_ENTRIES} its row pointers can hold"
        return None


@dataclass(frozen=True)
class CircuitShape:
    """The sizes of a circuit as its key (and r1cs) state them, which a cache made from them repeats.

    The identity of a key (size, mtime, header digest) can be copied into a file made by hand: a
    cache that claims it with other counts would give a synthesis worker's segment, or the device
    witness map's rows, another size than the prover of that key expects. :func:`open_cache`
    compares them (:meth:`mismatch`)."""

    n_vars: int
    n_public: int
    domain_size: int
    n_constraints: int | None  # the r1cs's (None: no r1cs, a cache without C rows)

    @classmethod
    def of_circuit(cls, n_wires: int, n_public: int, n_constraints: int) -> CircuitShape:
        """The shape of the key a setup of this circuit writes: the smallest power-of-two domain that
        holds its constraints and the one row per public wire (and the constant) a setup adds to A."""
        return cls(n_wires, n_public, 1 << domain_log_size(n_constraints + n_public + 1), n_constraints)

    def mismatch(self, counts: Counts) -> str | None:
        """What a cache's counts say otherwise than the key (and r1cs) do (None if nothing)."""
        c = counts
        for differ, problem in (
                (c.n_vars != self.n_vars, f"{c.n_vars} wires, the key has {self.n_vars}"),
                (c.n_public != self.n_public, f"{c.n_public} public signals, the key has {self.n_public}"),
                (c.domain_size != self.domain_size, f"a domain of {c.domain_size}, the key has {self.domain_size}"),
                (self.n_constraints is not None and c.n_constraints != self.n_constraints,
                 f"{c.n_constraints} constraints, the r1cs has {self.n_constraints}")):
            if differ:
                return problem
        return None


@dataclass
class CircuitData:
    """The coded A, B (and C) rows of one circuit and their coefficient table, usually a read-only mapping."""

    counts: Counts
    a: CodedMatrix
    b: CodedMatrix
    c: CodedMatrix | None
    table_mont: np.ndarray  # (n_codes, 4): v R
    table_r2: np.ndarray  # (n_codes, 4): v R^2
    path: str | None  # the cache file (None when built in memory)
    _buffer: object = None  # keeps the mapping (or the in-memory bytes) alive

    @property
    def nbytes(self) -> int:
        """Bytes of the body arrays."""
        return int(self.table_mont.nbytes * 2 + self.a.nbytes + self.b.nbytes + (self.c.nbytes if self.c else 0))

    def close(self) -> None:
        """Drop the arrays and the mapping (views taken earlier keep it alive until they are gone)."""
        self.a = self.b = self.c = None  # type: ignore[assignment]
        self.table_mont = self.table_r2 = None  # type: ignore[assignment]
        self._buffer = None


# ------------------------------------------------------------------ identities


def zkey_identity(path: str | os.PathLike[str]) -> FileIdentity:
    """Size, mtime and the digest of the zkey's header section (read, never mapped: a daemon calls this
    for every job, and a key copied over in place meanwhile gives a FormatError, not SIGBUS)."""
    return _identity(path, ZKEY_MAGIC, ZKEY_VERSION, ZKEY_LABELS, 2)


def r1cs_identity(path: str | os.PathLike[str]) -> FileIdentity:
    """Size, mtime and the digest of the r1cs's header section."""
    return _identity(path, R1CS_MAGIC, R1CS_VERSION, R1CS_LABELS, 1)


def _identity(path: str | os.PathLike[str], magic: str, version: int, labels: dict[int, str], sid: int) -> FileIdentity:
    st = _stat(path)
    header = read_sections(path, magic, (version,), [sid], labels=labels)[sid]
    return FileIdentity(st.st_size, st.st_mtime_ns, hashlib.blake2b(header, digest_size=16).digest())


def circuit_shape(zkey_path: str | os.PathLike[str], r1cs_path: str | os.PathLike[str] | None) -> CircuitShape:
    """The circuit's sizes from the key's header (and the r1cs's): the key is mapped and its header
    read, no section read whole."""
    with read_zkey(zkey_path, check_coefs=False) as zkey:
        n_vars, n_public, domain_size = zkey.n_vars, zkey.n_public, zkey.domain_size
    n_constraints = read_r1cs_header(r1cs_path)["n_constraints"] if r1cs_path is not None else None
    return CircuitShape(n_vars, n_public, domain_size, n_constraints)


def _stat(path: str | os.PathLike[str]) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise InputError(f"{os.fspath(path)}: cannot read: {exc.strerror or exc}") from exc

# ------------------------------------------------------------------ header


def _pack_header(counts: Counts, file_size: int, body: int, zkey: FileIdentity, r1cs: FileIdentity) -> bytes:
    c = counts
    raw = _HEAD.pack(MAGIC, VERSION, 0, file_size, body, zkey.size, zkey.mtime_ns, zkey.digest,
                     r1cs.size, r1cs.mtime_ns, r1cs.digest, int(c.has_c), c.code_bytes, c.n_vars, c.n_public,
                     c.domain_size, c.n_constraints, c.n_codes, c.a_rows, c.a_nnz, c.b_rows, c.b_nnz, c.c_rows, c.c_nnz)
    head = bytearray(raw.ljust(HEADER_BYTES, b"\0"))
    struct.pack_into("<I", head, _CRC_AT, zlib.crc32(head))
    return bytes(head)


def _unpack_header(head: bytes) -> tuple[Counts, int, int, FileIdentity, FileIdentity]:
    """(counts, file size, body hash, zkey identity, r1cs identity); ValueError says what is wrong."""
    if len(head) < HEADER_BYTES:
        raise ValueError(f"{len(head)} bytes, shorter than the {HEADER_BYTES}-byte header")
    f = _HEAD.unpack_from(head)
    if f[0] != MAGIC:
        raise ValueError(f"wrong magic {f[0]!r}")
    if f[1] != VERSION:
        raise ValueError(f"version {f[1]}, this code reads version {VERSION}")
    zeroed = bytearray(head[:HEADER_BYTES])
    struct.pack_into("<I", zeroed, _CRC_AT, 0)
    if zlib.crc32(zeroed) != f[2]:
        raise ValueError("header checksum mismatch")
    if f[11] not in (0, 1):
        raise ValueError(f"C-rows flag {f[11]}")
    counts = Counts(bool(f[11]), *f[12:])
    problem = counts.problem()
    if problem is not None:
        raise ValueError(problem)
    return counts, f[3], f[4], FileIdentity(*f[5:8]), FileIdentity(*f[8:11])


# ------------------------------------------------------------------ opening


class StaleCache(FormatError):
    """A sound cache file made from another key or r1cs (they were made again since), or by a release
    of another format version (its magic and version read; the rest of its header is not this
    version's to check): replaced where it is, never kept as damaged."""


def open_cache(path: str | os.PathLike[str], zkey: FileIdentity, r1cs: FileIdentity | None,
               shape: CircuitShape) -> CircuitData:
    """Map a cache file read-only after checking it is complete, intact, safe for the kernels
    (:func:`_check_body`), made from these files and of the circuit of that key (``shape``: its
    counts are the key's, :meth:`CircuitShape.mismatch`).

    ``r1cs`` None: a cache without C rows is expected. FormatError naming the file and the defect
    (StaleCache where it is sound but made from other files), or OSError, says why the file cannot
    be used; a caller that can rebuild it does.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES:
            raise FormatError(name, "header", f"{size} bytes, shorter than the {HEADER_BYTES}-byte header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        magic, version = struct.unpack_from("<8sI", mm)
        if magic == MAGIC and version != VERSION:  # what an upgrade or a rollback finds beside every key
            raise StaleCache(name, "header", f"made by another release of cuzk-mp (format version {version}, "
                                             f"this release reads {VERSION})")
        try:
            counts, file_size, body, zid, rid = _unpack_header(mm[:HEADER_BYTES])
        except ValueError as exc:
            raise FormatError(name, "header", f"not a circuit-data file of this version ({exc})") from None
        if file_size != size:
            raise FormatError(name, None, f"truncated or extended: {size} bytes, the header says {file_size}")
        if zid != zkey:
            raise StaleCache(name, None, "made from another key (size, mtime or header differ)")
        if counts.has_c != (r1cs is not None) or (r1cs is not None and rid != r1cs):
            raise StaleCache(name, None, "made from another r1cs (size, mtime or header differ)")
        problem = shape.mismatch(counts)
        if problem is not None:  # the identity of its files, not their circuit: made by hand
            raise FormatError(name, "header", f"not the circuit of its key: {problem}")
        data = _from_buffer(mm, counts, body, name)
        _check_body(data)
        return data
    except BaseException:
        try:
            mm.close()
        except BufferError:  # a view is still held by the traceback: the mapping goes with it
            pass
        raise


def _check_body(data: CircuitData) -> None:
    """FormatError naming the file, the array and the first bad entry where an index the kernels
    follow would leave its array: a row pointer that does not rise from 0 to the entry count, a
    column not below the wire count, a code not below the table's size; or a table value that is
    not a field element. The body hash cannot tell: anyone can compute it for a file made by hand.
    A pass over the arrays on every open (numpy reductions, no numba): ~0.1 s a matrix of 2^24 rows
    on one core, measured on random rows of that size, less than the body hash."""
    c, where = data.counts, data.path
    for label, m in (("A", data.a), ("B", data.b), ("C", data.c)):
        if m is None:
            continue
        ptr, nnz = m.indptr, m.nnz
        if int(ptr[0]) != 0 or int(ptr[-1]) != nnz:
            raise FormatError(where, f"{label} row pointers", f"they run from {int(ptr[0])} to {int(ptr[-1])}, "
                                     f"not from 0 to the {nnz} entries")
        for lo in range(0, ptr.shape[0] - 1, CHECK_CHUNK):
            hi = min(ptr.shape[0] - 1, lo + CHECK_CHUNK)
            down = np.flatnonzero(ptr[lo + 1 : hi + 1] < ptr[lo:hi])
            if down.size:
                r = lo + int(down[0])
                raise FormatError(where, f"{label} row pointers", f"row {r} ends at {int(ptr[r + 1])}, before it "
                                         f"starts ({int(ptr[r])})")
        for what, values, bound in (("columns", m.cols, c.n_vars), ("codes", m.codes, c.n_codes)):
            if nnz and int(values.max()) >= bound:
                k = int(np.flatnonzero(values >= bound)[0])
                raise FormatError(where, f"{label} {what}", f"entry {k} is {int(values[k])}, not below "
                                         f"{bound} (the {'wires' if what == 'columns' else 'distinct coefficients'})")
    for label, table in (("table (v R)", data.table_mont), ("table (v R^2)", data.table_r2)):
        bad = fr.first_noncanonical(table)
        if bad >= 0:
            raise FormatError(where, label, f"value {bad} is not a field element (>= r)")


def body_hash(body: np.ndarray) -> int:
    """A file body's check value: SHA-256 over its length and the SHA-256 of each 16 MiB block,
    cut to 64 bits. Blocks are hashed on every core this process may use (hashlib lets go of the
    GIL), ~1-2 GB/s a core with the CPU's SHA instructions: a 707 MiB 2^24 cache in well under a
    second, with no numba (a one-shot GPU proof opens the cache). The value does not depend on the
    thread count."""
    view = np.ascontiguousarray(body).view(np.uint8).data.cast("B")
    starts = range(0, len(view), HASH_BLOCK_BYTES)

    def block(lo: int) -> bytes:
        return hashlib.sha256(view[lo:lo + HASH_BLOCK_BYTES]).digest()

    workers = min(len(starts), len(os.sched_getaffinity(0)))
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cuzk-body-hash") as pool:
            digests = list(pool.map(block, starts))
    else:
        digests = [block(lo) for lo in starts]
    top = hashlib.sha256(len(view).to_bytes(8, "little"))
    for d in digests:
        top.update(d)
    return int.from_bytes(top.digest()[:8], "little")


def read_counts(path: str | os.PathLike[str]) -> Counts:
    """The sizes a cache file's header records (its header alone is read and checked; FormatError
    naming the file where it is not a circuit-data header of this version)."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    try:
        return _unpack_header(head)[0]
    except ValueError as exc:
        raise FormatError(os.fspath(path), "header", f"not a circuit-data file of this version ({exc})") from None


def _from_buffer(buf: mmap.mmap | np.ndarray, counts: Counts, body: int | None, path: str | None) -> CircuitData:
    layout, size = counts.layout()
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.shape[0] != size:
        raise FormatError(path or "circuit data", "header", f"{raw.shape[0]} bytes, the counts imply {size}")
    if body is not None:
        got = body_hash(raw[HEADER_BYTES:])
        if got != body:
            raise FormatError(path or "circuit data", "body", "body hash mismatch (damaged file)")

    def arr(name: str) -> np.ndarray:
        off, dt, shape = layout[name]
        return np.frombuffer(buf, dtype=dt, count=math.prod(shape), offset=off).reshape(shape)

    mats = {m: CodedMatrix(arr(f"{m}_ptr"), arr(f"{m}_col"), arr(f"{m}_code")) for m in ("a", "b", "c")
            if m != "c" or counts.has_c}
    return CircuitData(counts, mats["a"], mats["b"], mats.get("c"), arr("table_mont"), arr("table_r2"), path, buf)
