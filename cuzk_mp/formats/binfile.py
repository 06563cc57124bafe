"""The iden3 binary container shared by .r1cs, .wtns, .zkey and .ptau files.

Layout (@iden3/binfileutils, snarkjs-formats.md section 5.1)::

    magic      4 bytes ASCII ("r1cs" | "wtns" | "zkey" | "ptau")
    version    u32 LE
    nSections  u32 LE
    repeat nSections: { id u32 LE, size u64 LE, payload[size] }

This module owns the file mapping: :class:`BinFile` maps a file read-only
(``mmap``) and hands out zero-copy views of its sections; :func:`write_binfile`
streams sections to disk chunk by chunk, so a 10 GB zkey is never built in
memory. It knows nothing about what the sections mean: the r1cs, wtns and zkey
modules do. :class:`FieldReader` is the small cursor they use to parse the
fixed-layout header sections with errors that name file, section and field.

Stricter than binfileutils, on purpose: an id that appears twice anywhere in
the section table, a section that runs past the end of the file, and bytes
after the last section are errors at open time (snarkjs only notices a
duplicate when it reads that section, and ignores trailing bytes).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, Union

import numpy as np

from ..errors import FormatError, InputError
from .atomic import atomic_output, open_regular

Chunk = Union[bytes, bytearray, memoryview, np.ndarray]
Payload = Union[Chunk, Iterable[Chunk]]

_HEAD = struct.Struct("<4sII")  # magic, version, nSections
_SECTION_HEAD = struct.Struct("<IQ")  # id, size
_WRITE_ROWS_BYTES = 64 << 20  # non-contiguous arrays are written in slices of about this size
# The files a user may give in one another's place, by their first four bytes: this container's
# kinds and circom's witness generator (a WebAssembly module).
_MAGIC_KINDS = {b"r1cs": ".r1cs", b"wtns": ".wtns", b"zkey": ".zkey", b"ptau": ".ptau", b"\0asm": ".wasm"}


def file_kind(head: bytes) -> str | None:
    """What a file that starts with ``head`` is, for a message about a file given in another's place
    ("a .zkey file", "a .wasm file", "JSON text"), or None where its first bytes say nothing known."""
    if bytes(head[:4]) in _MAGIC_KINDS:
        return f"a {_MAGIC_KINDS[bytes(head[:4])]} file"
    if bytes(head[:64]).lstrip()[:1] in (b"{", b"["):
        return "JSON text"
    return None


def describe_source(src: object, name: str | None) -> str:
    """The name errors use for a file given as a path or as bytes."""
    if name is not None:
        return name
    if isinstance(src, (bytes, bytearray, memoryview)):
        return "<bytes>"
    return os.fspath(src)  # type: ignore[call-overload, no-any-return]


class BinFile:
    """A parsed, read-only iden3 binary file: its version and an index of its sections.

    Sections are looked up by id, whatever their order in the file. Every id
    appears at most once (checked at open). Views returned by :meth:`section`
    and :meth:`section_array` stay valid after :meth:`close`: they keep the
    mapping alive until they are dropped.
    """

    def __init__(
        self, buf: memoryview, name: str, magic: str, versions: Sequence[int],
        labels: Mapping[int, str] | None = None, mm: mmap.mmap | None = None,
    ) -> None:
        """Index ``buf`` (use :meth:`open` or :meth:`from_bytes`); ``mm`` is closed by :meth:`close`."""
        self._buf = buf
        self._mm = mm
        self.name = name
        self.magic = magic
        self.labels = dict(labels or {})
        self._sections: dict[int, tuple[int, int]] = {}
        self._order: list[int] = []
        self.version = self._parse(versions)

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], magic: str, versions: Sequence[int],
        *, labels: Mapping[int, str] | None = None, name: str | None = None, read: bool = False,
    ) -> BinFile:
        """Map ``path`` read-only and index its sections (FormatError if malformed). With ``read``,
        the file is read whole (``pread``) into memory of its own instead, for a file that is copied
        anyway (:meth:`own_array`): a file cut short while it is read is then a FormatError, where a
        mapping's page past the new end kills the reader with SIGBUS."""
        shown = describe_source(path, name)
        fd, size = open_regular(path, shown)
        try:
            if read:
                return cls(_read_whole(fd, size, shown, magic, versions, labels), shown, magic, versions, labels)
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise InputError(f"{shown}: cannot read: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        buf = memoryview(mm) if mm is not None else memoryview(b"")
        try:
            return cls(buf, shown, magic, versions, labels, mm)
        except FormatError:
            buf.release()
            if mm is not None:
                mm.close()
            raise

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | memoryview, name: str, magic: str, versions: Sequence[int],
        *, labels: Mapping[int, str] | None = None,
    ) -> BinFile:
        """Index an in-memory file (views are read-only even if ``data`` is writable)."""
        return cls(memoryview(data).cast("B").toreadonly(), name, magic, versions, labels)

    # ------------------------------------------------------------------ parsing

    def _parse(self, versions: Sequence[int]) -> int:
        buf = self._buf
        version, self._sections, self._order = _index(lambda pos, n: buf[pos : pos + n], len(buf), self.name,
                                                      self.magic, versions, self.labels)
        return version

    # ------------------------------------------------------------------ access

    @property
    def section_ids(self) -> tuple[int, ...]:
        """Section ids in file order."""
        return tuple(self._order)

    def has(self, sid: int) -> bool:
        """Whether section ``sid`` is present."""
        return sid in self._sections

    def where(self, sid: int) -> str:
        """How errors name section ``sid``, e.g. ``"2 (constraints)"``."""
        return _section_name(self.labels, sid)

    def error(self, sid: int | None, problem: str) -> FormatError:
        """A FormatError naming this file and section ``sid`` (None: the file as a whole)."""
        return FormatError(self.name, None if sid is None else self.where(sid), problem)

    def section_size(self, sid: int) -> int:
        """Payload size of section ``sid`` in bytes (FormatError if missing)."""
        return self._locate(sid)[1]

    def section(self, sid: int) -> memoryview:
        """Read-only view of the payload of section ``sid`` (FormatError if missing)."""
        start, size = self._locate(sid)
        return self._buf[start : start + size]

    def section_array(self, sid: int, dtype: Any, shape: int | tuple[int, ...], *, offset: int = 0) -> np.ndarray:
        """Zero-copy read-only array over section ``sid`` from byte ``offset``.

        The array must fill the rest of the section exactly, else FormatError
        naming the expected and actual sizes. Views over a file may be
        unaligned (``.flags.aligned`` is False when a previous section's size
        is not a multiple of 8); numpy and numba handle that.
        """
        start, size = self._locate(sid)
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shp, dtype=np.int64))
        want = offset + count * dt.itemsize
        if want != size:
            raise self.error(sid, f"size is {size} bytes, expected {want}")
        arr = np.frombuffer(self._buf, dtype=dt, count=count, offset=start + offset).reshape(shp)
        arr.flags.writeable = False
        return arr

    def own_array(self, sid: int, dtype: Any, shape: int | tuple[int, ...]) -> np.ndarray:
        """:meth:`section_array` as a writable array of its own: the read bytes themselves where the
        file was read into memory of this object's (``BinFile.open(read=True)``), else a copy."""
        arr = self.section_array(sid, dtype, shape)
        if self._mm is None and not self._buf.readonly:
            arr.flags.writeable = True  # over the bytes read for this object alone
            return arr
        return arr.copy()

    def _locate(self, sid: int) -> tuple[int, int]:
        try:
            return self._sections[sid]
        except KeyError:
            raise self.error(sid, "missing") from None

    def close(self) -> None:
        """Drop this object's hold on the mapping (views already taken keep it alive)."""
        try:
            self._buf.release()
        except BufferError:
            pass  # arrays still use the view; the mapping goes when they do
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass
            self._mm = None

    def __enter__(self) -> BinFile:
        """Context manager: :meth:`close` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the file."""
        self.close()


def _section_name(labels: Mapping[int, str] | None, sid: int) -> str:
    """How errors name a section: ``"2 (constraints)"`` where ``labels`` has it, else the id."""
    label = (labels or {}).get(sid)
    return f"{sid} ({label})" if label else str(sid)


def _index(read: Any, total: int, name: str, magic: str, versions: Sequence[int],
           labels: Mapping[int, str] | None) -> tuple[int, dict[int, tuple[int, int]], list[int]]:
    """The version and the section table (id -> (start, size), ids in file order) of a file of ``total``
    bytes, read through ``read(pos, n)``; FormatError naming ``name`` if malformed. A read that comes
    back short (the file shrank while read) is a truncation too."""
    def take(pos: int, st: struct.Struct) -> tuple[Any, ...]:
        raw = read(pos, st.size)
        if len(raw) < st.size:
            raise FormatError(name, None, f"truncated while read: {st.size} bytes at byte {pos}, got {len(raw)}")
        return st.unpack(raw)

    if total < _HEAD.size:
        raise FormatError(name, None, f"truncated header: file is {total} bytes, the header needs {_HEAD.size}")
    file_magic, version, n_sections = take(0, _HEAD)
    if file_magic != magic.encode("ascii"):
        kind = file_kind(read(0, 64))
        but = f" but {kind}" if kind else ""
        raise FormatError(name, None, f"wrong magic {file_magic!r}: not a .{magic} file{but}")
    if version not in versions:
        raise FormatError(name, None, f"version {version} not supported (expected {' or '.join(map(str, versions))})")
    sections: dict[int, tuple[int, int]] = {}
    order: list[int] = []
    pos = _HEAD.size
    for k in range(n_sections):
        if pos + _SECTION_HEAD.size > total:
            raise FormatError(name, None, f"truncated: entry {k + 1} of {n_sections} of the section table "
                              f"would start at byte {pos}, the file has {total} bytes")
        sid, size = take(pos, _SECTION_HEAD)
        start = pos + _SECTION_HEAD.size
        if start + size > total:
            raise FormatError(name, _section_name(labels, sid), f"truncated: {size} bytes declared at byte {start}, "
                              f"only {total - start} left in the file")
        if sid in sections:
            raise FormatError(name, _section_name(labels, sid), f"duplicated (at bytes {sections[sid][0]} and {start})")
        sections[sid] = (start, size)
        order.append(sid)
        pos = start + size
    if pos != total:
        raise FormatError(name, None, f"{total - pos} bytes of trailing garbage after the last section")
    return int(version), sections, order


_PREAD_MAX = 1 << 30  # Linux reads at most ~2 GiB in one call: a larger file takes several


def _read_whole(fd: int, size: int, shown: str, magic: str, versions: Sequence[int],
                labels: Mapping[int, str] | None) -> memoryview:
    """The file's ``size`` bytes read into memory of their own, placed so that its largest section
    starts on a 64-byte boundary: its array (a witness's values, at byte 76 of a .wtns) is then
    aligned, as a copy would be, and numba and the device copies take it as it is."""
    _, table, _ = _index(lambda pos, n: os.pread(fd, n, pos), size, shown, magic, versions, labels)
    start = max(table.values(), key=lambda section: section[1])[0] if table else 0
    raw = np.empty(size + 64, np.uint8)
    pad = -(raw.ctypes.data + start) % 64
    view = memoryview(raw.data)[pad : pad + size]
    got = _pread_into(fd, view)
    if got < size:
        raise FormatError(shown, None, f"truncated while read: {size} bytes, got {got}")
    return view


def _pread_into(fd: int, buf: memoryview) -> int:
    """Fill ``buf`` from byte 0 of ``fd``; the bytes read, fewer where the file ends first."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done : done + _PREAD_MAX]], done)
        if n == 0:
            break
        done += n
    return done


def read_sections(path: str | os.PathLike[str], magic: str, versions: Sequence[int], sids: Sequence[int], *,
                  labels: Mapping[int, str] | None = None, name: str | None = None) -> dict[int, bytes]:
    """The payloads of the sections ``sids`` of the file at ``path`` (FormatError if one is missing), read with
    ``pread``, the file never mapped. Why: a mapping whose file is truncated under it (a key copied
    over in place) kills the reader with SIGBUS, and a daemon that looks at a key's header while
    it serves other jobs must get a FormatError instead. The same checks as :meth:`BinFile.open`."""
    shown = describe_source(path, name)
    fd, size = open_regular(path, shown)
    try:
        _, table, _ = _index(lambda pos, n: os.pread(fd, n, pos), size, shown, magic, versions, labels)
        out = {}
        for sid in sids:
            if sid not in table:
                raise FormatError(shown, _section_name(labels, sid), "missing")
            start, size = table[sid]
            data = os.pread(fd, size, start)
            if len(data) < size:
                raise FormatError(shown, _section_name(labels, sid), f"truncated while read: {size} bytes at byte "
                                  f"{start}, got {len(data)}")
            out[sid] = data
        return out
    except OSError as exc:
        raise InputError(f"{shown}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


class FieldReader:
    """A cursor over one fixed-layout section; errors name file, section and field."""

    def __init__(self, bf: BinFile, sid: int) -> None:
        """Start at byte 0 of section ``sid`` of ``bf`` (FormatError if it is missing)."""
        self.bf = bf
        self.sid = sid
        self.buf = bf.section(sid)
        self.pos = 0

    def take(self, n: int, field: str) -> memoryview:
        """The next ``n`` bytes (FormatError if the section ends first)."""
        if self.pos + n > len(self.buf):
            raise self.bf.error(self.sid, f"truncated in field {field}: section is {len(self.buf)} bytes")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, field: str) -> int:
        """Next little-endian u32."""
        return int.from_bytes(self.take(4, field), "little")

    def u64(self, field: str) -> int:
        """Next little-endian u64."""
        return int.from_bytes(self.take(8, field), "little")

    def bigint(self, n8: int, field: str) -> int:
        """Next ``n8``-byte little-endian unsigned integer."""
        return int.from_bytes(self.take(n8, field), "little")

    def limbs(self, nlimbs: int, field: str) -> np.ndarray:
        """Next ``nlimbs`` u64 limbs as a fresh ``(nlimbs,) uint64`` array."""
        return np.frombuffer(self.take(8 * nlimbs, field), dtype="<u8").astype(np.uint64)

    def end(self) -> None:
        """Require that the whole section was consumed."""
        if self.pos != len(self.buf):
            raise self.bf.error(self.sid, f"size is {len(self.buf)} bytes, its fields take {self.pos}")


def open_source(
    src: str | os.PathLike[str] | bytes | bytearray | memoryview, name: str | None, magic: str,
    versions: Sequence[int], labels: Mapping[int, str], *, read: bool = False,
) -> BinFile:
    """:meth:`BinFile.open` for a path (``read``: read, not mapped), :meth:`BinFile.from_bytes` for
    in-memory data."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return BinFile.from_bytes(src, describe_source(src, name), magic, versions, labels=labels)
    return BinFile.open(src, magic, versions, labels=labels, name=name, read=read)


# ---------------------------------------------------------------------- writing


def _chunks(payload: Payload) -> Iterable[Chunk]:
    if isinstance(payload, (bytes, bytearray, memoryview, np.ndarray)):
        return (payload,)
    return payload


def _write_array(f: IO[bytes], arr: np.ndarray) -> int:
    if arr.dtype.fields is None and arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.flags.c_contiguous:
        f.write(arr.data)
        return int(arr.nbytes)
    rows = max(1, _WRITE_ROWS_BYTES // max(1, arr[:1].nbytes))
    for lo in range(0, arr.shape[0], rows):
        f.write(np.ascontiguousarray(arr[lo : lo + rows]).data)
    return int(arr.nbytes)


def write_sections(f: IO[bytes], magic: str, version: int, sections: Sequence[tuple[int, Payload]]) -> None:
    """Write a whole binfile to ``f``. A section given as one buffer has its size written before its
    bytes; one given as chunks (a stream made as it is written) has its size patched afterwards,
    which needs a seekable ``f``. So a file of buffers alone (a .wtns) goes to a pipe as to a file
    (``wc c.wasm in.json /dev/stdout | gzip``)."""
    f.write(_HEAD.pack(magic.encode("ascii"), version, len(sections)))
    for sid, payload in sections:
        if isinstance(payload, np.ndarray):
            f.write(_SECTION_HEAD.pack(sid, payload.nbytes))
            _write_array(f, payload)
            continue
        if isinstance(payload, (bytes, bytearray, memoryview)):
            view = memoryview(payload).cast("B")
            f.write(_SECTION_HEAD.pack(sid, view.nbytes))
            f.write(view)
            continue
        head_at = f.tell()
        f.write(_SECTION_HEAD.pack(sid, 0))
        size = 0
        for chunk in _chunks(payload):
            if isinstance(chunk, np.ndarray):
                size += _write_array(f, chunk)
            else:
                view = memoryview(chunk).cast("B")
                f.write(view)
                size += view.nbytes
        end = f.tell()
        f.seek(head_at)
        f.write(_SECTION_HEAD.pack(sid, size))
        f.seek(end)


def write_binfile(path: str | os.PathLike[str], magic: str, version: int,
                  sections: Sequence[tuple[int, Payload]]) -> None:
    """Stream an iden3 binfile to ``path``, sections in the given order.

    Each payload is one buffer (bytes, memoryview, numpy array: raw C-order
    bytes) or an iterable of them (a list of chunks or a generator, consumed
    once, one chunk at a time). Written through :func:`atomic_output`.
    """
    with atomic_output(path) as f:
        write_sections(f, magic, version, sections)
