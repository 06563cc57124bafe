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

The WAL is read a batch of frames at a time (:data:`BATCH_BYTES`: a long run between checkpoints
leaves one of any size), from a regular file only: a FIFO there is refused, not waited on
(:func:`~cuzk_mp.formats.atomic.open_regular`).

Speed: the frames' checksums are checked with numpy, a batch at once, at disk speed (a 256 MiB WAL
in well under a second where the word-by-word loop of :func:`_checksum` took ~4.6 s). The checksum
is a linear recurrence mod 2^32 over word pairs (``s1 += x0 + s2; s2 += x1 + s1``, in matrix form
``s' = M s + (x0, x0 + x1)`` with ``M = [[1, 1], [1, 2]]``), so a frame's result is ``M^n`` times the
state before it plus a dot product of its words with coefficients precomputed from the powers of
``M`` (:func:`_coefficients`); uint32 arithmetic wraps exactly as SQLite's does. A frame is checked
against the state its predecessor records (its stored checksum): every frame before the first bad
one matched it, so each frame of a batch is checked independently. :func:`_checksum`, the plain
recurrence, checks the WAL header and is the tests' oracle.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cuzk_mp.formats.atomic import open_regular_if_there

_MAGICS = {0x377F0682: "<", 0x377F0683: ">"}  # checksum words little- / big-endian
_VERSION = 3007000
_HEADER = struct.Struct(">8I")
_FRAME_HEADER = struct.Struct(">6I")
_MASK = 0xFFFFFFFF
BATCH_BYTES = 256 << 10  # frames read and checked at once (at least one frame, of up to 64 KiB)
_U32 = np.uint32


def _checksum(data: bytes, order: str, s1: int, s2: int) -> tuple[int, int]:
    """SQLite's WAL checksum (walChecksumBytes) of ``data``, continuing from (s1, s2)."""
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    it = iter(words)
    for x0, x1 in zip(it, it):
        s1 = (s1 + x0 + s2) & _MASK
        s2 = (s2 + x1 + s1) & _MASK
    return s1, s2


@functools.lru_cache(maxsize=8)
def _coefficients(page_size: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """For a frame of ``page_size`` (its words as uint32, header included): the (words, 2) coefficients
    whose dot product with the words is the frame's own share of (s1, s2), and ``M^n`` (2, 2), which
    carries the state before the frame, where ``n`` is the frame's number of checksummed word pairs
    (its first two header words, then its page; the salts and checksums, words 2..5, weigh 0)."""
    n = 1 + page_size // 8
    powers = np.empty((n + 1, 2, 2), dtype=np.uint64)  # M^j mod 2^32, j = 0..n
    a, b, c, d = 1, 0, 0, 1
    for j in range(n + 1):
        powers[j] = ((a, b), (c, d))
        a, b, c, d = (a + c) & _MASK, (b + d) & _MASK, (a + 2 * c) & _MASK, (b + 2 * d) & _MASK  # M @ M^j
    later = powers[n - 1::-1]  # pair k of the frame is carried by M^(n-1-k)
    # (x0, x1) enters as (x0, x0 + x1): x0 weighs p[.,0] + p[.,1], x1 weighs p[.,1]
    pair = np.stack([(later[:, :, 0] + later[:, :, 1]) & _MASK, later[:, :, 1]], axis=1)  # (n, 2 words, 2 sums)
    coef = np.zeros((6 + page_size // 4, 2), dtype=np.uint64)
    coef[0:2] = pair[0]
    coef[6:] = pair[1:].reshape(-1, 2)
    return coef.astype(_U32), powers[n].astype(_U32)


def _frame_checksums(frames: bytes, order: str, page_size: int, s1: npt.NDArray[np.uint32],
                     s2: npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """The checksums (s1, s2) after each of the whole frames in ``frames``, each continuing from the state
    ``(s1[i], s2[i])`` given for it: :func:`_checksum` of the frame's first 8 bytes, then of its page."""
    coef, carry = _coefficients(page_size)
    words = np.frombuffer(frames, dtype=f"{order}u4").reshape(-1, 6 + page_size // 4).astype(_U32)
    own = words @ coef  # uint32: every product and sum wraps mod 2^32, as SQLite's
    return (carry[0, 0] * s1 + carry[0, 1] * s2 + own[:, 0],
            carry[1, 0] * s1 + carry[1, 1] * s2 + own[:, 1])


def _first_bad_frame(fd: int, n_frames: int, order: str, page_size: int, salts: tuple[int, int],
                     start: tuple[int, int]) -> int | None:
    """The index of the first frame that fails its checksum or carries other salts (or page number 0),
    ``n_frames`` where none does; None where the file ends before its last frame (shorter than it
    was: no frame from there on). ``start``: the header's checksum, which the first frame continues."""
    frame_size = _FRAME_HEADER.size + page_size
    per_batch = max(1, BATCH_BYTES // frame_size)
    prev = np.array(start, dtype=_U32)
    for first in range(0, n_frames, per_batch):
        count = min(per_batch, n_frames - first)
        data = os.pread(fd, count * frame_size, _HEADER.size + first * frame_size)
        if len(data) < count * frame_size:
            return None
        head = np.frombuffer(data, dtype=">u4").reshape(count, -1)[:, :6].astype(_U32)  # big-endian fields
        s1 = np.concatenate([prev[:1], head[:-1, 4]])  # each frame continues from its predecessor's checksum
        s2 = np.concatenate([prev[1:], head[:-1, 5]])
        c1, c2 = _frame_checksums(data, order, page_size, s1, s2)
        ok = ((head[:, 2] == salts[0]) & (head[:, 3] == salts[1]) & (head[:, 0] != 0)
              & (c1 == head[:, 4]) & (c2 == head[:, 5]))
        if not ok.all():
            return first + int(np.argmin(ok))
        prev = head[-1, 4:6].copy()
    return n_frames


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
    n_frames = (size - _HEADER.size) // (_FRAME_HEADER.size + page_size)
    i = _first_bad_frame(fd, n_frames, order, page_size, (salt1, salt2), (c1, c2))
    if i is None or i == n_frames:
        return None
    commits = _commits_after(fd, size, page_size, i, (salt1, salt2))
    if commits >= 2:
        return (f"frame {i} of {n_frames} is damaged, so SQLite would ignore it and the "
                f"{commits} committed transactions after it")
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
