"""What synthesis needs from a circuit, prepared once into a compact read-only file mapped by every worker.

The witness map reads the A and B rows of the zkey's coefficient section (section 4) and, for
the witness check, the C rows of the circuit's .r1cs. Decoded as 32-byte coefficients they take
3.4 GiB at 2^24, and every synthesis worker used to hold its own copy. Here they are stored once
per circuit as :class:`~cuzk_mp.algebra.coded_sparse.CodedMatrix` rows (uint32 columns and
row pointers, a uint16 code per entry, uint32 past 65536 values, into one table of the distinct
coefficients, with +1 and -1 on reserved codes: 707 MiB instead of 3.4 GiB at 2^24), mapped
read-only, so the page cache holds one copy that every worker shares. (The synthetic circuits'
witness generators need no circuit data beyond a few module constants: nothing else is cached.)

The file's layout, its header and the checks on opening it are :mod:`.circuit_data_file`'s; this
module builds the files (the coded rows, checked against the r1cs) and decides where they live.

Where it lives: beside the key (``<key path>.synth-ab[c]``); when the key's directory is not
writable, in ``circuit-data`` of cuzk-mp's cache folder (:func:`cuzk_mp.paths.default_cache_dir`:
``$CUZK_MP_CACHE``, else ``$XDG_CACHE_HOME/cuzk-mp``, else ``~/.cache/cuzk-mp``) under the
key's name and a hash of its absolute path; or in an explicit ``cache_dir``. It is built under an
exclusive ``flock`` of ``<cache>.lock`` (concurrent workers wait for one builder), written to a
temporary file, flushed and renamed into place, so a reader never sees half a file (a builder
that died leaves its temporary file, removed by the next builder, who holds the lock). Any defect
found on opening (:func:`~.circuit_data_file.open_cache`) is a FormatError naming the file and the
defect; where the cache can be made again (:func:`open_or_build`, :func:`open_or_build_from`), a
stale one (a changed key, another version) is replaced and a damaged one moved aside to
``<cache>.damaged`` and made again, with a warning, never a wrong result.

Decisions: a stale cache is replaced, never deleted, so a worker that mapped the old one keeps a
valid mapping. The lock file stays (removing it would race with a waiter).
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import logging
import math
import mmap
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..algebra import fr
from ..algebra.coded_sparse import MAX_ENTRIES, DistinctValues, code_dtype
from ..algebra.field import FR, Q_MOD, R_MOD, int_to_limbs
from ..algebra.row_codes import CODE_MINUS_ONE, CODE_ONE
from ..algebra.sparse import CsrMatrix
from ..errors import CuzkError, FormatError, InputError
from ..formats.r1cs import R1CS, R1csLayout, scan_r1cs
from ..formats.zkey import ZKey, read_zkey
from ..paths import default_cache_dir
from .circuit_data_file import (
    HEADER_BYTES, CircuitData, CircuitShape, Counts, FileIdentity, StaleCache, _from_buffer, _pack_header, body_hash,
    circuit_shape, open_cache, r1cs_identity, zkey_identity,
)

log = logging.getLogger("cuzk_mp.groth16.circuit_data")

C_ROW_CHUNK = 1 << 20  # r1cs constraints decoded at a time while building (bounded memory)
_ONE_MONT = int_to_limbs(FR.r_mod, 4)
_MINUS_ONE_MONT = int_to_limbs(R_MOD - FR.r_mod, 4)


# ------------------------------------------------------------------ where the cache lives


def default_cache_root() -> Path:
    """Where caches go when the key's directory is not writable: ``circuit-data`` in cuzk-mp's cache folder."""
    return default_cache_dir() / "circuit-data"


def cache_candidates(zkey_path: str | os.PathLike[str], with_c: bool, cache_dir: str | os.PathLike[str] | None = None
                     ) -> list[Path]:
    """The cache files tried in order: beside the key, then the fallback directory (or only ``cache_dir``)."""
    key = Path(zkey_path).resolve()
    suffix = ".synth-abc" if with_c else ".synth-ab"
    tagged = f"{key.name}-{hashlib.sha256(str(key).encode()).hexdigest()[:16]}{suffix}"
    if cache_dir is not None:
        return [Path(cache_dir).expanduser() / tagged]
    return [key.with_name(key.name + suffix), default_cache_root() / tagged]


# ------------------------------------------------------------------ building


class _CSource:
    """The C rows of the r1cs, a bounded chunk at a time: from a mapped file or an in-memory R1CS."""

    def __init__(self, r1cs: R1CS | R1csLayout) -> None:
        self.r1cs = r1cs
        if isinstance(r1cs, R1CS):
            self.n_rows, self.n_wires, self.n_public = r1cs.n_constraints, r1cs.n_wires, r1cs.n_public
            self.nnz_a, self.nnz_b = r1cs.a.nnz, r1cs.b.nnz
            self.row_counts = np.diff(r1cs.c.indptr)
            self.name = str(r1cs.path or "r1cs")
        else:
            h = r1cs.head
            self.n_rows, self.n_wires, self.n_public = h["n_constraints"], h["n_wires"], h["n_pub_out"] + h["n_pub_in"]
            self.nnz_a, self.nnz_b = int(r1cs.counts[0].sum(dtype=np.int64)), int(r1cs.counts[1].sum(dtype=np.int64))
            self.row_counts = r1cs.counts[2]
            self.name = r1cs.bf.name
        self.nnz = int(np.sum(self.row_counts, dtype=np.int64))
        if self.nnz > MAX_ENTRIES:
            raise InputError(f"{self.name}: C has {self.nnz} entries, more than the {MAX_ENTRIES} "
                             "the witness check supports")

    def chunks(self) -> Iterator[tuple[int, CsrMatrix]]:
        """(first row, C's rows lo .. lo+k-1 as CSR with standard-form data), in row order."""
        return self.chunks_of(2)

    def chunks_of(self, m: int) -> Iterator[tuple[int, CsrMatrix]]:
        """The same for matrix ``m`` (0 A, 1 B, 2 C)."""
        for lo in range(0, self.n_rows, C_ROW_CHUNK):
            hi = min(self.n_rows, lo + C_ROW_CHUNK)
            if isinstance(self.r1cs, R1CS):
                c = (self.r1cs.a, self.r1cs.b, self.r1cs.c)[m]
                p0, p1 = int(c.indptr[lo]), int(c.indptr[hi])
                yield lo, CsrMatrix(c.indptr[lo : hi + 1] - p0, c.indices[p0:p1], c.data[p0:p1], c.n_cols)
            else:
                yield lo, self.r1cs.decode(m, lo, hi)


def check_header_match(r1cs_name: str, n_wires: int, n_public: int, n_rows: int, zkey: ZKey) -> None:
    """InputError where an r1cs's header cannot be the circuit of ``zkey`` (its wires, public
    signals, or constraints that do not fit the key's domain): what the headers alone tell."""
    where = f"{r1cs_name} does not match {zkey.path or 'zkey'}"
    if n_wires != zkey.n_vars or n_public != zkey.n_public:
        raise InputError(f"{where}: r1cs has {n_wires} wires / {n_public} public, "
                         f"zkey has {zkey.n_vars} / {zkey.n_public}")
    if n_rows + n_public + 1 > zkey.domain_size:
        raise InputError(f"{where}: {n_rows} constraints do not fit the domain of {zkey.domain_size}")


def _check_match(zkey: ZKey, src: _CSource, a_nnz: int, b_nnz: int) -> None:
    """The r1cs must be the circuit of the key (what snarkjs's setup derives from it)."""
    check_header_match(src.name, src.n_wires, src.n_public, src.n_rows, zkey)
    where = f"{src.name} does not match {zkey.path or 'zkey'}"
    if a_nnz != src.nnz_a + src.n_public + 1 or b_nnz != src.nnz_b:
        raise InputError(f"{where}: coefficient counts differ (zkey A/B {a_nnz}/{b_nnz}, "
                         f"r1cs A/B {src.nnz_a}/{src.nnz_b} + {src.n_public + 1} public rows)")


class _Builder:
    """Two passes: collect the distinct coefficients and the counts (the layout), then fill a buffer."""

    def __init__(self, zkey: ZKey, r1cs: R1CS | R1csLayout | None, *, check_ab: bool = True) -> None:
        """``check_ab``: compare the key's A, B rows with the r1cs's (see :meth:`_check_ab`); off
        where the key's rows were derived from this very r1cs."""
        self.zkey = zkey
        self.check_ab = check_ab
        coefs = zkey.coefs
        self.m, self.c, self.s, self.v = coefs["matrix"], coefs["constraint"], coefs["signal"], coefs["value"]
        row_counts = np.zeros((2, zkey.domain_size), dtype=np.int64)
        from ..formats.zkey_kernels import count_rows  # numba: only a build needs it

        bad = count_rows(self.m, self.c, zkey.domain_size, row_counts)
        if bad >= 0:
            raise InputError(f"{zkey.path or 'zkey'}: coefficient {bad}: matrix {self.m[bad]}, "
                             f"constraint {self.c[bad]} (domain {zkey.domain_size})")
        self.rows = [_used_rows(row_counts[k]) for k in range(2)]
        self.ptr_ab = [np.cumsum(np.concatenate([[0], row_counts[k, : self.rows[k]]])) for k in range(2)]
        self.src = _CSource(r1cs) if r1cs is not None else None
        if self.src is not None:
            _check_match(zkey, self.src, int(self.ptr_ab[0][-1]), int(self.ptr_ab[1][-1]))
        self.zvals = DistinctValues()
        self.zvals.add(self.v)
        self.cvals = DistinctValues()
        if self.src is not None:
            for _, chunk in self.src.chunks():
                self.cvals.add(chunk.data)
        self.table_mont, self.zmap, self.cmap = self._table()
        src = self.src
        self.counts = Counts(
            has_c=src is not None, code_bytes=code_dtype(self.table_mont.shape[0]).itemsize, n_vars=zkey.n_vars,
            n_public=zkey.n_public, domain_size=zkey.domain_size, n_constraints=src.n_rows if src else 0,
            n_codes=self.table_mont.shape[0], a_rows=self.rows[0], a_nnz=int(self.ptr_ab[0][-1]), b_rows=self.rows[1],
            b_nnz=int(self.ptr_ab[1][-1]), c_rows=src.n_rows if src else 0, c_nnz=src.nnz if src else 0)

    def _table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The global table (v R): +1, -1, then the zkey's values, then the r1cs's new ones; and the maps to it."""
        rows: dict[bytes, int] = {_ONE_MONT.tobytes(): CODE_ONE, _MINUS_ONE_MONT.tobytes(): CODE_MINUS_ONE}
        table = [_ONE_MONT, _MINUS_ONE_MONT]

        def codes_of(mont: np.ndarray) -> np.ndarray:
            out = np.empty(mont.shape[0], dtype=np.uint32)
            for i, row in enumerate(mont):
                key = row.tobytes()
                if key not in rows:
                    rows[key] = len(table)
                    table.append(row)
                out[i] = rows[key]
            return out

        zmap = codes_of(fr.from_mont(np.ascontiguousarray(self.zvals.values)))  # v R^2 -> v R
        cmap = codes_of(fr.to_mont(np.ascontiguousarray(self.cvals.values)))  # v -> v R
        return np.stack(table), zmap, cmap

    def fill(self, buf: np.ndarray) -> None:
        """Write the body arrays into ``buf`` (the whole file's bytes; the header is left alone)."""
        layout, _ = self.counts.layout()

        def arr(name: str) -> np.ndarray:
            off, dt, shape = layout[name]
            return buf[off : off + math.prod(shape) * dt.itemsize].view(dt).reshape(shape)

        arr("table_mont")[:] = self.table_mont
        arr("table_r2")[:] = fr.to_mont(self.table_mont)
        codes = np.empty(self.m.shape[0], dtype=code_dtype(self.counts.n_codes))
        self.zvals.lookup_into(self.v, self.zmap, codes)
        for k, name in enumerate("ab"):
            arr(f"{name}_ptr")[:] = self.ptr_ab[k]
        from .circuit_data_kernels import scatter_rows

        scatter_rows(self.m, self.c, self.s, codes, arr("a_ptr"), arr("b_ptr"), arr("a_col"), arr("b_col"),
                     arr("a_code"), arr("b_code"))
        del codes
        if self.src is not None:
            ptr, col, code = arr("c_ptr"), arr("c_col"), arr("c_code")
            ptr[0] = 0
            ptr[1:] = np.cumsum(self.src.row_counts, dtype=np.int64)
            for lo, chunk in self.src.chunks():
                p0 = int(ptr[lo])
                col[p0 : p0 + chunk.nnz] = chunk.indices
                self.cvals.lookup_into(chunk.data, self.cmap, code[p0 : p0 + chunk.nnz])
            if self.check_ab:
                self._check_ab(arr)

    def _check_ab(self, arr: Callable[[str], np.ndarray]) -> None:
        """The key's A and B rows must be the r1cs's (what a setup derives from it: its rows, then
        A's row i = wire i for each public wire i <= nPublic), or the witness check would mix one
        circuit's A, B with another's C. Compared as A x and B x at x = (1, t, t^2, ...) for a
        random t, a chunk of rows at a time: two different rows agree there with probability
        below nVars / r (Schwartz-Zippel)."""
        src = self.src
        assert src is not None
        # x = t^i in Montgomery form (t^i R) for the key's rows (v R), in R^2 form for the r1cs's (v):
        # either way a row's products come out as (sum v t^i) R
        x_for_key = fr.powers(secrets.randbelow(R_MOD - 1) + 1, src.n_wires)
        x_for_r1cs = fr.to_mont(x_for_key)
        where = f"{src.name} does not match {self.zkey.path or 'zkey'}"
        for k, name in enumerate("AB"):
            ptr, col, code = arr(f"{name.lower()}_ptr"), arr(f"{name.lower()}_col"), arr(f"{name.lower()}_code")
            n_key_rows = ptr.shape[0] - 1

            def key_rows(lo: int, hi: int) -> np.ndarray:
                hi_k = min(hi, n_key_rows)
                out = np.zeros((hi - lo, 4), np.uint64)
                if lo < hi_k:
                    p0, p1 = int(ptr[lo]), int(ptr[hi_k])
                    rows = CsrMatrix(ptr[lo : hi_k + 1] - p0, col[p0:p1], self.table_mont[code[p0:p1]], src.n_wires)
                    out[: hi_k - lo] = rows.matvec(x_for_key)
                return out

            for lo, theirs in src.chunks_of(k):
                differ = np.flatnonzero((key_rows(lo, lo + theirs.n_rows) != theirs.matvec(x_for_r1cs)).any(axis=1))
                if differ.size:
                    raise InputError(f"{where}: constraint {lo + int(differ[0])}: the r1cs's {name} row is not the "
                                     "key's (the key was not made from this r1cs)")
            if k == 0:  # the public rows a setup appends to A: wire i in row nConstraints + i
                n_pub = src.n_public + 1
                mine = key_rows(src.n_rows, src.n_rows + n_pub)
                if not np.array_equal(mine, x_for_key[:n_pub]):  # a coefficient 1 (R): the wire's t^i R
                    raise InputError(f"{where}: the key's A rows of the public wires are not the ones a setup "
                                     "of this r1cs writes")


def _used_rows(row_counts: np.ndarray) -> int:
    """Rows up to the last non-empty one (later rows are implicitly empty)."""
    nz = np.flatnonzero(row_counts)
    return int(nz[-1]) + 1 if nz.size else 0


def build_in_memory(zkey: ZKey, r1cs: R1CS | None = None) -> CircuitData:
    """The circuit data of an in-memory key (and r1cs), in the same layout as a cache file."""
    builder = _Builder(zkey, r1cs)
    _, size = builder.counts.layout()
    buf = np.zeros(size, dtype=np.uint8)
    builder.fill(buf)
    return _from_buffer(buf, builder.counts, None, None)


def build_cache(zkey_path: str | os.PathLike[str], r1cs_path: str | os.PathLike[str] | None, dest: Path) -> None:
    """Build the cache file ``dest`` from the key (and r1cs): a temporary file renamed into place."""
    zid = zkey_identity(zkey_path)
    rid = r1cs_identity(r1cs_path) if r1cs_path is not None else FileIdentity.none()
    with read_zkey(zkey_path) as zkey:
        layout = scan_r1cs(r1cs_path) if r1cs_path is not None else None
        try:
            _write_cache(_Builder(zkey, layout), dest, zid, rid)
        finally:
            if layout is not None:
                layout.close()


def build_from_r1cs(r1cs: R1CS, dest: Path, identity: FileIdentity) -> None:
    """Build the cache file ``dest`` of an in-memory circuit, with no key file: its A and B rows are
    the coefficient section a setup of ``r1cs`` would write (:func:`~.setup.snarkjs_coefs`), its C
    rows the r1cs's. ``identity`` stands for both the key and the r1cs in the header (what
    :func:`open_cache` is later asked to match): a key generated into a backend from this data has
    no file of its own."""
    from .setup import snarkjs_coefs

    n = CircuitShape.of_circuit(r1cs.n_wires, r1cs.n_public, r1cs.n_constraints).domain_size
    none = np.zeros(0, np.uint64)
    head = ZKey(path=f"{r1cs.path or 'circuit'} (no key file)", n8q=48, q=Q_MOD, n8r=32, r=R_MOD,
                n_vars=r1cs.n_wires, n_public=r1cs.n_public, domain_size=n, alpha1=none, beta1=none, beta2=none,
                gamma2=none, delta1=none, delta2=none, ic=none, coefs=snarkjs_coefs(r1cs), a=none, b1=none,
                b2=none, c=none, h=none, contributions=b"")
    _write_cache(_Builder(head, r1cs, check_ab=False), dest, identity, identity)  # A, B made from it


def _write_cache(builder: _Builder, dest: Path, zid: FileIdentity, rid: FileIdentity) -> None:
    """Fill a temporary file with the builder's body and header, flush it and rename it to ``dest``."""
    t0 = time.perf_counter()
    _, size = builder.counts.layout()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "r+b") as f:
            # the blocks are reserved before the mapping is written: a full disk is then an
            # OSError here (the next place is tried), not a SIGBUS on the first page it cannot back
            os.posix_fallocate(f.fileno(), 0, size)
            failure: BaseException | None = None
            mm = mmap.mmap(f.fileno(), size)
            try:
                buf = np.frombuffer(mm, dtype=np.uint8)
                try:
                    builder.fill(buf)
                    body = body_hash(buf[HEADER_BYTES:])
                    mm[:HEADER_BYTES] = _pack_header(builder.counts, size, body, zid, rid)
                    mm.flush()
                except BaseException as exc:  # (a SIGINT too) raised as it is, once the mapping is let go
                    failure = exc
                del buf
            finally:
                _close_written(mm, failure)
            if failure is not None:
                raise failure
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    c = builder.counts
    log.info("built %s: %d A + %d B + %d C entries, %d distinct coefficients, %.1f MiB in %.1f s", dest, c.a_nnz,
             c.b_nnz, c.c_nnz, c.n_codes, size / 2**20, time.perf_counter() - t0)


def _close_written(mm: mmap.mmap, failure: BaseException | None) -> None:
    """Unmap a cache file's mapping once it is written (or its build failed). Views of it can
    outlive their code: in a failure's frames (its traceback, and the exceptions it was raised
    while handling), and in reference cycles the collector has not reached yet (numba's first
    compile of a kernel for new argument types leaves frames holding the arrays it was called
    with). The cycles are collected and the close tried again; a view that still lives keeps the
    mapping until it goes, which costs nothing here: the bytes were flushed before, and the
    failure, if any, is what the caller must hear of, never a BufferError."""
    try:
        mm.close()
        return
    except BufferError:
        if failure is not None:
            return
    gc.collect()
    try:
        mm.close()
    except BufferError:
        log.debug("the circuit-data mapping outlives its build: a view of it is still held")


def open_or_build(zkey_path: str | os.PathLike[str], r1cs_path: str | os.PathLike[str] | None,
                  cache_dir: str | os.PathLike[str] | None = None) -> CircuitData:
    """The circuit data of (key, r1cs): a valid cache mapped read-only, built first when there is none."""
    zid = zkey_identity(zkey_path)
    rid = r1cs_identity(r1cs_path) if r1cs_path is not None else None
    shape = circuit_shape(zkey_path, r1cs_path)
    candidates = cache_candidates(zkey_path, r1cs_path is not None, cache_dir)
    for path in candidates:
        data = _try_open(path, zid, rid, shape)
        if data is not None:
            return data
    problems: list[str] = []
    for path in candidates:
        data = _build_at(path, zid, rid, shape, lambda dest: build_cache(zkey_path, r1cs_path, dest), problems)
        if data is not None:
            return data
    raise CuzkError(f"no writable place for the circuit-data cache of {os.fspath(zkey_path)}: {'; '.join(problems)}")


def open_or_build_from(path: Path, identity: FileIdentity, shape: CircuitShape,
                       make_r1cs: Callable[[], R1CS]) -> CircuitData:
    """The circuit data at ``path`` if it was built for ``identity`` and is of ``shape`` (the
    circuit's, :meth:`CircuitShape.of_circuit`), else built first from ``make_r1cs()``
    (:func:`build_from_r1cs`, under the same lock as any other build)."""
    data = _try_open(path, identity, identity, shape)
    if data is not None:
        return data
    problems: list[str] = []
    data = _build_at(path, identity, identity, shape, lambda dest: build_from_r1cs(make_r1cs(), dest, identity),
                     problems)
    if data is None:
        raise CuzkError(f"cannot write the circuit data {path}: {'; '.join(problems)}")
    return data


def _build_at(path: Path, zid: FileIdentity, rid: FileIdentity | None, shape: CircuitShape,
              build: Callable[[Path], None], problems: list[str]) -> CircuitData | None:
    """Build the cache at ``path`` under its lock (unless another process just did); None if it cannot go there."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        problems.append(f"{path.parent}: {exc.strerror or exc}")
        return None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return open_cache(path, zid, rid, shape)  # another process may have built it meanwhile
        except (OSError, StaleCache):
            pass  # none yet, made from other files, or not a file it can read (a directory): replaced below
        except FormatError as exc:
            _move_aside(path, exc)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a builder that died: none runs now
            stale.unlink(missing_ok=True)
        try:
            build(path)
        except OSError as exc:  # not writable, full, or in the way: the next place is tried
            log.warning("cannot write the circuit-data cache %s: %s", path, exc.strerror or exc)
            problems.append(f"{path}: {exc.strerror or exc}")
            return None
        try:
            return open_cache(path, zid, rid, shape)
        except (OSError, FormatError) as exc:
            raise CuzkError(f"{path}: the circuit-data cache just built does not open: {exc}") from exc


def _move_aside(path: Path, problem: FormatError) -> None:
    """A damaged cache (cut short, changed by hand, another program's file) goes to
    ``<cache>.damaged`` before it is made again, as a damaged cached dev key does
    (:mod:`cuzk_mp.pipeline.keys`): kept for a look, never read again. Called under the cache's
    lock; a worker that mapped it keeps its mapping (a rename, as a replacement)."""
    damaged = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, damaged)
    except OSError as exc:
        log.warning("%s: making it again (it could not be moved aside: %s)", problem, exc.strerror or exc)
        return
    log.warning("%s: moved to %s and made again", problem, damaged.name)


def _try_open(path: Path, zid: FileIdentity, rid: FileIdentity | None,
              shape: CircuitShape) -> CircuitData | None:
    """The cache at ``path`` if it is sound and made from these files, else None: the caller builds
    it under its lock (:func:`_build_at`), where a damaged one is moved aside with a warning. A
    name the file system refuses (a key's name near the 255-byte limit, plus the cache's suffix)
    holds no cache: None, and its build there fails as a place that cannot be written."""
    try:
        if not path.exists():
            return None
    except OSError:
        return None
    try:
        return open_cache(path, zid, rid, shape)
    except (OSError, FormatError) as exc:  # a key made again is routine
        log.info("circuit-data cache %s; rebuilding it", exc)
        return None
