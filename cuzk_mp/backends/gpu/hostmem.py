"""Host memory the GPU backend holds: key file pages let go once the device has them.

A zkey read from a file is a read-only mapping (:mod:`cuzk_mp.formats.binfile`);
its point sections are uploaded straight from the mapping, and afterwards
:func:`release_pages` drops this process's pages of those sections
(``madvise(MADV_DONTNEED)``) and, for a key that stays resident (a daemon's, a bench's), asks
the kernel to drop them from the page cache too (``posix_fadvise(POSIX_FADV_DONTNEED)``); a key
loaded for one proof leaves the file cached for the next process. That is safe for every other user of the
:class:`~cuzk_mp.formats.zkey.ZKey`: a later read of the same array faults the
pages in again from the file. Memory that is not a file mapping (a key parsed from
bytes, a key built in memory) is never released: there, dropping pages would lose
data, so :func:`release_pages` leaves it alone.

:func:`mapped_rss` reads ``/proc/self/smaps`` for what the prover holds: the resident
bytes of the mappings behind some arrays. No CuPy here (tested on CPU-only CI).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MADV_DONTNEED = 4
# the process's own symbols, libc's among them (ctypes.util.find_library would run ldconfig: ~2 ms of
# a one-shot prove's start)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@dataclass(frozen=True)
class Mapping:
    """One line of ``/proc/self/maps``: [start, end), permissions, file offset, path ('' if anonymous)."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str

    @property
    def file_backed(self) -> bool:
        """A regular file's mapping (not anonymous memory, not [heap]/[stack], not deleted)."""
        return self.inode != 0 and self.path.startswith("/") and not self.path.endswith(" (deleted)")


def _parse_maps_line(line: str) -> Mapping:
    parts = line.split(maxsplit=5)
    lo, hi = (int(x, 16) for x in parts[0].split("-"))
    path = parts[5].strip() if len(parts) > 5 else ""
    return Mapping(lo, hi, parts[1], int(parts[2], 16), int(parts[4]), path)


def mapping_of(addr: int) -> Mapping | None:
    """The mapping of this process that holds address ``addr``, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            m = _parse_maps_line(line)
            if m.start <= addr < m.end:
                return m
    return None


def _interior(a: np.ndarray) -> tuple[int, int]:
    """The whole pages inside ``a``'s bytes: [start, end), possibly empty."""
    lo = int(a.ctypes.data)
    hi = lo + int(a.nbytes)
    return -(-lo // PAGE) * PAGE, hi // PAGE * PAGE


def release_pages(a: np.ndarray, drop_cache: bool = True) -> int:
    """Drop the whole pages of ``a`` from this process and (``drop_cache``) from the page cache,
    if ``a`` lies in a read-only file mapping; returns the bytes released (0 when ``a`` is not such
    memory).

    The data stays readable: a later access reads the file again. ``drop_cache=False`` leaves the
    file in the page cache, where the next process that loads the same key finds it (a one-shot
    ``groth16 prove`` after another: its key is read again every time).
    """
    if not isinstance(a, np.ndarray) or a.nbytes == 0 or not a.flags.c_contiguous:
        return 0
    lo, hi = _interior(a)
    if hi <= lo:
        return 0
    m = mapping_of(lo)
    if m is None or not m.file_backed or "w" in m.perms or hi > m.end:
        return 0
    if _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED) != 0:
        return 0
    if drop_cache and hasattr(os, "posix_fadvise"):
        try:
            fd = os.open(m.path, os.O_RDONLY)
        except OSError:
            return hi - lo
        try:
            os.posix_fadvise(fd, m.offset + (lo - m.start), hi - lo, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
    return hi - lo


def mapped_rss(arrays: list[np.ndarray]) -> int:
    """Resident bytes (smaps ``Rss``) of the distinct mappings that hold ``arrays``: for a
    key read from a file, the pages of the whole key file this process still holds."""
    addrs = [int(a.ctypes.data) for a in arrays if isinstance(a, np.ndarray) and a.nbytes]
    if not addrs:
        return 0
    total, current, counted = 0, None, set()
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                current = _parse_maps_line(line)
            elif (head == "Rss:" and current is not None and current.start not in counted
                  and any(current.start <= x < current.end for x in addrs)):
                counted.add(current.start)
                total += int(line.split()[1]) * 1024
    return total
