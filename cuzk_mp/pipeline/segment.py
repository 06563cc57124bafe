"""The segment of a ring slot: its byte layout, its size, views of its arrays, and its mapping.

A slot ring (:mod:`.ring`) decides who owns a slot; this module owns what the slot holds: the
shm segment ``/<ring>-<slot>`` a producer writes a partition into and a consumer stages from. It
knows nothing of slot states or of the control block, so the memory model (:mod:`.memory`) can
size a partition (:func:`partition_segment_bytes`) without a ring.

Segments persist; first touch is off the critical path. Writing into a fresh tmpfs
mapping allocates, zeroes and maps one 4 KiB page at a time (measured with
``python -m cuzk_mp.pipeline.shmprobe``, perf/results/pipeline-shm-first-touch.json:
2.0 GB/s with ``madvise(MADV_POPULATE_WRITE)`` on the H200 host, ~1 s for a 2^24
partition's 2.1 GB, as long as its synthesis), and mapping an existing segment
again costs a page-table fill (a few GB/s). So a slot's segment outlives the
partition: the consumer frees the *slot* after staging, not its segment, and every
process keeps its mapping of each slot's segment (:class:`SegmentMapping`, keyed by the
slot's generation ``gen``), so in steady state a producer writes into pages that
are already allocated and mapped, and the consumer reads them the same way. The
generation changes whenever the segment is remade (another circuit's size) or
trimmed; a process maps again when its generation is stale, and never touches a
stale mapping. Where the kernel lets tmpfs use transparent huge pages
(``shmem_enabled`` = ``advise``), the mapping asks for them (fewer faults).

Segment layout: a fixed header of :data:`HEADER_BYTES` (u64 length, then a msgpack
``SegmentLayout`` with the partition's metadata and the array offsets, written at
publish), then each ``(rows, 4)`` uint64 array on a page boundary. Every byte a
consumer reads is written by the partition's producer (the witness and a, b, c
kernels write every row), so a reused segment never leaks one partition into the
next.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import posix_ipc

from ..errors import ResourceError
from .shm_names import SHM_DIR, shm_full, shm_space

ALIGN = 4096  # arrays start on page boundaries (host registration of sub-ranges needs it)
HEADER_BYTES = 4 * ALIGN  # layout + metadata of a segment (job id, circuit paths, timings: a few hundred bytes)
MADV_POPULATE_READ = 22  # linux/mman.h (kernel >= 5.14); Python 3.11's mmap module lacks the names
MADV_POPULATE_WRITE = 23
MADV_HUGEPAGE = 14
FR_BYTES = 32  # one Fr element: 4 uint64 limbs


class SegmentLayout(msgspec.Struct, array_like=True):
    """What a segment's header holds after its length word: the partition's metadata and its arrays."""

    meta: bytes
    arrays: list[tuple[int, int, int]]  # (offset, rows, cols) of (rows, cols) uint64 arrays


@dataclass
class SegmentMapping:
    """This process's mapping of one slot's segment, valid while the slot's ``gen`` is unchanged."""

    gen: int
    size: int
    buf: mmap.mmap


def partition_shapes(domain_size: int, n_vars: int, abc: bool = True) -> list[tuple[int, int]]:
    """The arrays of one partition in its segment, in order: a, b, c (domain rows) and w (n_vars rows);
    w alone without ``abc`` (a circuit whose prover makes a, b, c on the device)."""
    return ([(domain_size, 4)] * 3 if abc else []) + [(n_vars, 4)]


def array_offsets(shapes: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int, int]], int]:
    pos = HEADER_BYTES
    offsets = []
    for rows, cols in shapes:
        offsets.append((pos, int(rows), int(cols)))
        pos += _round_up(int(rows) * int(cols) * 8)
    return offsets, pos


def segment_bytes(shapes: Sequence[tuple[int, int]]) -> int:
    """The exact size of a segment holding uint64 arrays of these shapes (the header included).

    This is the memory model's unit: host memory for partitions is at most ring_slots x this.
    """
    return array_offsets(shapes)[1]


def partition_segment_bytes(domain_size: int, n_vars: int, abc: bool = True) -> int:
    """:func:`segment_bytes` of one partition of a circuit (its a, b, c and w; w alone without ``abc``)."""
    return segment_bytes(partition_shapes(domain_size, n_vars, abc))


def _round_up(n: int) -> int:
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


class SegmentView:
    """Views of a slot's segment: ``meta`` (opaque bytes) and uint64 arrays. Call :meth:`close`.

    The mapping behind the views belongs to the :class:`Ring` (it outlives the partition);
    closing a view drops its arrays, not the mapping.
    """

    def __init__(self, buf: mmap.mmap, meta: bytes, arrays: list[np.ndarray],
                 layout: list[tuple[int, int, int]]) -> None:
        self._buf: mmap.mmap | None = buf
        self.meta = meta
        self.arrays = arrays
        self.layout = layout
        self.nbytes = len(buf)

    def write_header(self, meta: bytes) -> None:
        """Write the layout and ``meta`` into the header (the producer, before it publishes)."""
        head = msgspec.msgpack.encode(SegmentLayout(meta, self.layout))
        if 8 + len(head) > HEADER_BYTES:
            raise ValueError(f"segment metadata of {len(head)} bytes does not fit the {HEADER_BYTES}-byte header")
        assert self._buf is not None
        self._buf[:8] = len(head).to_bytes(8, "little")
        self._buf[8 : 8 + len(head)] = head
        self.meta = meta

    def close(self) -> None:
        """Drop the views (idempotent). Copies must be taken before this."""
        self.arrays = []
        self._buf = None

    def __enter__(self) -> SegmentView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_segment(name: str, size: int, *, create: bool) -> mmap.mmap:
    """Map segment ``name`` (``size`` bytes) and populate its page tables.

    ``create`` (the producer): open or create it and make its size ``size`` (a shrink frees the
    pages past the end, a growth adds unallocated ones), then fault every page writable in one
    kernel call. Otherwise (the consumer) map it as it is, pages populated for reading. What the
    system cannot give (a file or pages in /dev/shm, a mapping) is a ResourceError naming the segment
    and its size, so the partition fails saying what to change, not as an internal error.
    """
    what = f"a ring segment of {size / 2**20:.1f} MiB ({name})"
    try:
        shm = _open_own_segment(name, create)
    except OSError as e:  # ENOSPC: the tmpfs has no inode left for a new file (nr_inodes), whatever its bytes
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        raise ResourceError(shm_full(what)) from None
    try:
        if create and os.fstat(shm.fd).st_size != size:
            os.ftruncate(shm.fd, size)
        if create:  # a page the tmpfs cannot give is a SIGBUS when written: say so before (not
            # posix_fallocate, which would take the pages now, small ones, where the mapping's
            # MADV_HUGEPAGE can have huge ones)
            missing, space = size - os.fstat(shm.fd).st_blocks * 512, shm_space()
            if space is not None and missing > space[0]:
                raise ResourceError(shm_full(what))
        try:
            buf = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED)
        except OSError as e:  # ENOMEM: no address space left (ulimit -v, vm.max_map_count), not /dev/shm's fault
            if e.errno != errno.ENOMEM:
                raise
            raise ResourceError(f"cannot map {what} into memory: {e.strerror} (the process's address space "
                                "or its number of mappings is at its limit: ulimit -v, vm.max_map_count)") from None
    finally:
        os.close(shm.fd)
    try:
        _populate(buf, write=create)
    except BaseException:
        buf.close()
        raise
    return buf


def _open_own_segment(name: str, create: bool) -> posix_ipc.SharedMemory:
    """Open (``create``: or make, mode 0600) a slot segment that is this user's alone.

    The names are visible in /dev/shm: another user could make a segment of the next name first
    (mode 0666) and read or change the witnesses written into it. A segment owned by another user
    or open to others is unlinked and made again where this process may (root, or its own), else
    refused with a ResourceError naming it; never written."""
    for _ in range(2):
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX if create else 0, mode=0o600)
        except posix_ipc.ExistentialError:
            if not create:
                raise
            shm = posix_ipc.SharedMemory(name, 0)  # ours from an earlier partition, or someone else's
        st = os.fstat(shm.fd)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return shm
        os.close(shm.fd)
        if create:
            with contextlib.suppress(posix_ipc.ExistentialError, OSError):  # not ours to unlink: refused below
                posix_ipc.unlink_shared_memory(name)
        if not create or os.path.lexists(SHM_DIR + name):  # not ours to replace (another user's, sticky /dev/shm)
            raise ResourceError(f"{SHM_DIR}{name}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, "
                                f"not this user's alone: refusing to put a witness into it (remove it, or set "
                                f"another shm prefix)")
    raise ResourceError(f"{SHM_DIR}{name}: made again by another process while it was being replaced")


def _populate(buf: mmap.mmap, *, write: bool) -> None:
    """Fault every page of a mapping in one kernel call (huge pages where tmpfs allows them)."""
    with contextlib.suppress(OSError):
        buf.madvise(MADV_HUGEPAGE)
    try:
        buf.madvise(MADV_POPULATE_WRITE if write else MADV_POPULATE_READ)
    except OSError as e:  # kernel < 5.14 (EINVAL): touch one byte per page instead
        if e.errno != errno.EINVAL:  # the pages cannot be had (EFAULT, ENOMEM): touching them is a SIGBUS
            raise ResourceError(shm_full(f"the pages of a ring segment of {len(buf) / 2**20:.1f} MiB")) from None
        view = np.frombuffer(buf, np.uint8)
        if write:
            view[:: mmap.PAGESIZE] = view[:: mmap.PAGESIZE]
        else:
            int(view[:: mmap.PAGESIZE].sum())
        del view


def open_segment_fd(name: str) -> int | None:
    """A read-write fd of an existing segment (None if there is none)."""
    try:
        return int(posix_ipc.SharedMemory(name).fd)
    except posix_ipc.ExistentialError:
        return None


def unlink_segment(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass
