"""Detect a damaged SQLite write-ahead log before SQLite silently drops its committed frames.

The journal runs in WAL mode: a committed job may live only in ``<journal>-wal`` until the next
checkpoint. When SQLite opens a database whose WAL has a damaged header, or a damaged frame, it
keeps the valid frames before the damage and *silently ignores everything after it*, committed
transactions included; its integrity check cannot notice, because what it ignored is simply
gone. So the daemon reads the WAL itself first (format: sqlite.org/fileformat2.html#walformat)
and calls it damaged when frames that SQLite would ignore hold committed transactions:

* a WAL header (magic, version, page size, checksum) that is invalid while frames follow it and
  at least two of them end a transaction;
* a frame that fails its checksum (or carries other salts) followed by frames of the current
  salts that end at least two transactions.

The rule spares the one case SQLite itself is right to ignore: a crash that tore the last
transaction while it was written (never acknowledged: the journal commits with
``synchronous=FULL``), which leaves at most one transaction-ending frame after the tear. Damage
confined to that last transaction is indistinguishable from such a tear and is not reported.

The WAL is read a frame at a time (a long run between checkpoints leaves one of any size), from a
regular file only: a FIFO there is refused, not waited on (:func:`~cuzk_mp.formats.atomic.open_regular`).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cuzk_mp.formats.atomic import open_regular_if_there

_MAGICS = {0x377F0682: "<", 0x377F0683: ">"}  # checksum words little- / big-endian
_VERSION = 3007000
_HEADER = struct.Struct(">8I")
_FRAME_HEADER = struct.Struct(">6I")
_MASK = 0xFFFFFFFF


def _checksum(data: bytes, order: str, s1: int, s2: int) -> tuple[int, int]:
    """SQLite's WAL checksum (walChecksumBytes) of ``data``, continuing from (s1, s2)."""
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    it = iter(words)
    for x0, x1 in zip(it, it):
        s1 = (s1 + x0 + s2) & _MASK
        s2 = (s2 + x1 + s1) & _MASK
    return s1, s2


def wal_damage(path: Path) -> str | None:
    """Why the WAL at ``path`` would lose committed transactions, or None if it would not
    (also None when there is no WAL); InputError where it is no regular file."""
    opened = open_regular_if_there(path, str(path))
    if opened is None:
        return None
    fd, size = opened
    try:
        return _damage(fd, size)
    finally:
        os.close(fd)


def _damage(fd: int, size: int) -> str | None:
    """:func:`wal_damage` of the WAL open as ``fd``, ``size`` bytes long."""
    header = os.pread(fd, _HEADER.size, 0)
    if size <= _HEADER.size or len(header) < _HEADER.size:
        return None  # no frames: nothing SQLite could drop
    magic, version, page_size, _, salt1, salt2, c1, c2 = _HEADER.unpack(header)
    order = _MAGICS.get(magic)
    header_ok = (order is not None and version == _VERSION and page_size >= 512
                 and page_size & (page_size - 1) == 0 and page_size <= 65536
                 and _checksum(header[:24], order, 0, 0) == (c1, c2))
    if not header_ok:
        # Without a trusted header, take the salts the first frame carries and the usual sizes.
        for page in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512):
            commits = _commits_after(fd, size, page, 0, None)
            if commits >= 2:
                return (f"its header is damaged, so SQLite would ignore all of it, and its frames "
                        f"hold {commits} committed transactions")
        return None
    assert order is not None
    frame_size = _FRAME_HEADER.size + page_size
    n_frames = (size - _HEADER.size) // frame_size
    s1, s2 = c1, c2
    for i in range(n_frames):
        frame = os.pread(fd, frame_size, _HEADER.size + i * frame_size)
        if len(frame) < frame_size:
            return None  # shorter than it was: no frame from here on
        pgno, _, f_salt1, f_salt2, f_c1, f_c2 = _FRAME_HEADER.unpack_from(frame)
        if (f_salt1, f_salt2) == (salt1, salt2) and pgno != 0:
            s1, s2 = _checksum(frame[:8], order, s1, s2)
            s1, s2 = _checksum(frame[24:], order, s1, s2)
            if (s1, s2) == (f_c1, f_c2):
                continue
        commits = _commits_after(fd, size, page_size, i, (salt1, salt2))
        if commits >= 2:
            return (f"frame {i} of {n_frames} is damaged, so SQLite would ignore it and the "
                    f"{commits} committed transactions after it")
        return None
    return None


def _commits_after(fd: int, size: int, page_size: int, first: int, salts: tuple[int, int] | None) -> int:
    """Frames from index ``first`` on that end a transaction and carry ``salts`` (None: the
    salts of frame ``first``), in the WAL open as ``fd`` (``size`` bytes); only frame headers are read."""
    frame_size = _FRAME_HEADER.size + page_size
    n_frames = (size - _HEADER.size) // frame_size
    count = 0
    for i in range(first, n_frames):
        header = os.pread(fd, _FRAME_HEADER.size, _HEADER.size + i * frame_size)
        if len(header) < _FRAME_HEADER.size:
            break
        _, commit, f_salt1, f_salt2, _, _ = _FRAME_HEADER.unpack(header)
        if salts is None:
            salts = (f_salt1, f_salt2)
        if commit != 0 and (f_salt1, f_salt2) == salts:
            count += 1
    return count
