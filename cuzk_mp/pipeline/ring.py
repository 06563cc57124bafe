"""The slot ring: K shared-memory slots between synthesis workers and prover processes.

Owns every named IPC object of one engine, all named ``/<ring>-...`` where ``<ring>`` is
``<prefix>.<8 hex digits>``, the engine's prefix and a token drawn for this ring alone:

* ``/<ring>-ctl``  the control block (shm): one 80-byte record per slot,
* ``/<ring>-free``, ``/<ring>-ready``  named semaphores (free / ready slots),
* ``/<ring>-<slot>``  the segment of a slot: made by the first partition that uses the
  slot, kept (pages and all) while the ring is busy, trimmed once the slot has idled.

Names are matched exactly, and a new ring removes what killed processes left, never a live
process's ring nor another user's objects: :mod:`.shm_names`.

Control block layout (little-endian)::

    0     header: magic, n_slots, peak_live, free_waits, ready_waits, published, released, reclaimed,
                  trimmed, segments_made, owner_pid, owner_start, owner_pidns (u64 each; 16 words)
    128   slot 0: state u32 | partition i32 | owner_pid i64 | task_id u64 | job_seq u64
                  | priority i64 | nbytes u64 | t_ready f64 | uses u64 | gen u64 | t_free f64
    208   slot 1 ...

Slot states and who owns the slot (the pid in ``owner_pid``)::

    FREE --producer claims--> FILLING --producer publishes--> READY --consumer takes--> STAGING
      ^   (owner: synthesis worker: it synthesises              (owner: prover process)   |
      |    the partition straight into the slot's segment)                                |
      +--------------------- consumer frees the slot right after staging -----------------+

A producer claims a FREE slot *before* it computes (:meth:`Ring.acquire_free`
blocks while none is free: that is the backpressure), gets writable views of the
slot's segment (:meth:`Ring.writable_segment`) and writes w, a, b, c into them;
there is no private copy of the vectors and no second copy into the ring. It
publishes the slot with the partition's metadata (:meth:`Ring.publish`), or gives
it back (:meth:`Ring.abandon`) when the partition fails or is cancelled. When a
process dies, the engine frees what it owned (:meth:`Ring.reclaim`).

The control block is the truth; the semaphores are wake-ups that count free and
ready slots. Every wait is ``acquire(timeout)`` followed by a re-scan of the
control block, so a token lost with a killed process (or an extra one posted by
a reclaim) costs at most one poll interval, never a deadlock, and nobody spins.
Record changes happen under a lock that is a ``threading.Lock`` (threads of one
process) plus an ``fcntl`` lock on the control block's fd (processes): the kernel
drops the latter when its holder dies, so ``kill -9`` never leaves the ring locked.

Segments, their layout and how each process maps them (a mapping outlives the partition):
:mod:`.segment`.

Memory bound: every slot holds at most one segment, the size of the last partition
written into it (a producer resizes it, ``ftruncate``, when its partition's size
differs), so at most ``n_slots`` segments exist at any moment and host memory for
partitions is at most ring_slots x segment, whatever the load. Memory returns to the
system when the ring idles: :meth:`Ring.trim` (the engine calls it every second)
truncates and unlinks the segment of every slot that has been FREE for
``TRIM_IDLE_S``; truncation frees the pages at once, even those still mapped by
another process (whose mapping is stale from then on). Producers pick, among the
FREE slots, one whose segment already has the size they need and that they map
already, most recently freed first, so a lightly loaded ring keeps using a few warm
slots and lets the others idle into trimming.

The times in a slot's record (``t_ready``, ``t_free``) are ``time.monotonic()``: other processes of
the box subtract them from their own readings (a prover's wait for a READY slot, the engine's trim),
and a step of the wall clock must neither keep an idle ring's memory nor make a wait negative;
CLOCK_MONOTONIC is one clock for every process of a Linux box.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import posix_ipc

from ..errors import Cancelled, ResourceError
from .segment import (
    SegmentLayout,
    SegmentMapping,
    SegmentView,
    array_offsets,
    map_segment,
    open_segment_fd,
    unlink_segment,
)
from .shm_names import (
    HEADER_WORDS,
    MAGIC,
    TOKEN_BYTES,
    cleanup_stale,
    remove_abandoned,
    shm_full,
    stamp,
)

FREE, FILLING, READY, STAGING = 0, 1, 2, 3
STATE_NAMES = ("free", "filling", "ready", "staging")
_PEAK, _FREE_WAITS, _READY_WAITS, _PUBLISHED, _RELEASED, _RECLAIMED, _TRIMMED, _MADE = 2, 3, 4, 5, 6, 7, 8, 9
SLOT_DTYPE = np.dtype([
    ("state", "<u4"), ("partition", "<i4"), ("owner_pid", "<i8"), ("task_id", "<u8"), ("job_seq", "<u8"),
    ("priority", "<i8"), ("nbytes", "<u8"), ("t_ready", "<f8"), ("uses", "<u8"), ("gen", "<u8"),
    ("t_free", "<f8"),
])
POLL_S = 0.25
# A FREE slot's segment is trimmed (truncated and unlinked: its memory returns to the system) once the
# slot has been FREE this long. A busy ring reuses every slot within a few device stages (seconds, even
# at 2^26), so this only fires when the load has dropped.
TRIM_IDLE_S = 10.0


@dataclass(frozen=True)
class RingHandle:
    """What a child process needs to attach to a ring (picklable)."""

    prefix: str
    n_slots: int


@dataclass(frozen=True)
class SlotClaim:
    """The partition a producer is about to write: recorded in the slot's record."""

    task_id: int
    job_seq: int
    partition: int
    priority: int


class SlotRecord(msgspec.Struct, frozen=True):
    """A copy of one slot's control-block record (the ring's own status row).

    ``nbytes`` is the size of the segment the slot holds (0: none), whatever its state.
    """

    slot: int
    state: str
    owner_pid: int
    task_id: int
    job_seq: int
    partition: int
    priority: int
    nbytes: int
    t_ready: float  # when the slot became READY (time.monotonic(); 0: not READY)
    gen: int = 0  # the segment's generation: changes whenever it is remade or trimmed
    t_free: float = 0.0  # when the slot last became FREE (time.monotonic(); 0: never used)


class RingStats(msgspec.Struct, frozen=True):
    """The ring's counters: live and peak slots in use, waits, and slot transitions since creation."""

    live: int  # slots in use (FILLING, READY or STAGING)
    peak_live: int
    free_waits: int  # a producer found no free slot and blocked
    ready_waits: int  # a consumer found no ready slot and blocked
    published: int
    released: int
    reclaimed: int  # freed because their owner died
    held: int = 0  # slots holding a segment (in use, or FREE and not trimmed yet)
    held_bytes: int = 0  # bytes of those segments
    segments_made: int = 0  # segments created or resized (each paid its first touch)
    trimmed: int = 0  # segments trimmed after idling


class Ring:
    """One engine's slot ring, as seen from one process (engine, synth worker or prover)."""

    def __init__(self, handle: RingHandle, ctl: posix_ipc.SharedMemory, owner: bool) -> None:
        self.handle = handle
        self.owner = owner
        size = 8 * HEADER_WORDS + SLOT_DTYPE.itemsize * handle.n_slots
        self._ctl_fd = ctl.fd
        self._ctl_map = mmap.mmap(ctl.fd, size)
        self._header = np.ndarray((HEADER_WORDS,), np.uint64, buffer=self._ctl_map, offset=0)
        self._slots = np.ndarray((handle.n_slots,), SLOT_DTYPE, buffer=self._ctl_map, offset=8 * HEADER_WORDS)
        self._free = posix_ipc.Semaphore(self._name("free"))
        self._ready = posix_ipc.Semaphore(self._name("ready"))
        self._tlock = threading.Lock()
        self._maps: dict[int, SegmentMapping] = {}  # this process's mappings of slot segments
        self._mlock = threading.Lock()  # guards _maps (a prover's worker threads share it)
        self._closed = False
        self._final = RingStats(0, 0, 0, 0, 0, 0, 0)  # the counters when closed: what stats() says then

    # ---- lifecycle
    @classmethod
    def create(cls, prefix: str, n_slots: int) -> Ring:
        """Create a fresh ring of the engine prefix ``prefix`` (removing what earlier rings of the
        prefix left first); its own name, ``handle.prefix``, adds a token (see the module docstring)."""
        remove_abandoned(prefix)
        name = f"{prefix}.{secrets.token_hex(TOKEN_BYTES)}"
        handle = RingHandle(name, n_slots)
        size = 8 * HEADER_WORDS + SLOT_DTYPE.itemsize * n_slots
        ctl = None
        try:
            ctl = posix_ipc.SharedMemory(f"/{name}-ctl", posix_ipc.O_CREX, mode=0o600, size=size)
            stamp(ctl.fd, n_slots)  # the owner first: a kill from here on leaves a ring others can judge
            posix_ipc.Semaphore(f"/{name}-free", posix_ipc.O_CREX, initial_value=n_slots).close()
            posix_ipc.Semaphore(f"/{name}-ready", posix_ipc.O_CREX, initial_value=0).close()
        except OSError as e:
            if ctl is not None:
                ctl.close_fd()
            cleanup_stale(name)
            if e.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            raise ResourceError(shm_full("the ring's control block and semaphores")) from None
        return cls(handle, ctl, owner=True)  # a new control block is zeros but for the stamp

    @classmethod
    def attach(cls, handle: RingHandle) -> Ring:
        """Open an existing ring from a child process."""
        ctl = posix_ipc.SharedMemory(f"/{handle.prefix}-ctl")
        ring = cls(handle, ctl, owner=False)
        if int(ring._header[0]) != MAGIC or int(ring._header[1]) != handle.n_slots:
            ring.close()
            raise RuntimeError(f"/{handle.prefix}-ctl is not a ring control block of {handle.n_slots} slots")
        return ring

    @property
    def closed(self) -> bool:
        """Whether this process's handles are released (after :meth:`close` or :meth:`destroy`)."""
        return self._closed

    def close(self) -> None:
        """Release this process's handles and segment mappings (idempotent); the named objects stay."""
        if self._closed:
            return
        self._closed = True
        for slot in list(self._maps):
            self._unmap(slot)
        # without the lock (a child killed in it may hold it): the counters only grow, so a read may miss
        # a last increment but never goes below an earlier read; no slot is in use for a closed ring
        self._final = _stats_of([int(x) for x in self._header], live=0, held=np.zeros(0, np.int64))
        del self._header, self._slots
        self._ctl_map.close()
        os.close(self._ctl_fd)
        self._free.close()
        self._ready.close()

    def destroy(self) -> list[str]:
        """Close and unlink every named object of this ring, segments included."""
        self.close()
        return self.unlink()

    def unlink(self) -> list[str]:
        """Unlink every named object of this ring, segments included; what was removed. Handles stay
        usable: a process that has an object open or mapped keeps it (a stopping engine unlinks the
        names before its provers leave, :mod:`.engine`)."""
        return cleanup_stale(self.handle.prefix)

    def _name(self, what: str | int) -> str:
        return f"/{self.handle.prefix}-{what}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            fcntl.lockf(self._ctl_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self._ctl_fd, fcntl.LOCK_UN)

    # ---- producer side (synthesis worker)
    def acquire_free(self, claim: SlotClaim, abort: Callable[[], bool], timeout_s: float | None = None,
                     nbytes: int = 0) -> int | None:
        """Block until a slot is FREE, claim it (FILLING, owner = this pid); None if aborted/timed out.

        ``nbytes``: the segment size the producer needs (:func:`segment_bytes`). Among the FREE
        slots it takes one whose segment has that size and that this process maps already, then
        one of that size, then any; the most recently freed first (see the module docstring).
        """
        def take() -> int | None:
            free = np.flatnonzero(self._slots["state"] == FREE)
            if not free.size:
                return None
            rec = self._slots[free]
            maps = dict(self._maps)
            warm = np.array([int(s) in maps and maps[int(s)].gen == int(g) for s, g in zip(free, rec["gen"])])
            held = rec["nbytes"] > 0
            sized = held & (rec["nbytes"] == nbytes)
            order = np.lexsort((-rec["t_free"], -held.astype(np.int8), -sized.astype(np.int8),
                                -warm.astype(np.int8)))
            slot = int(free[order[0]])
            self._set(slot, FILLING, claim)
            live = int(np.count_nonzero(self._slots["state"] != FREE))
            self._header[_PEAK] = max(int(self._header[_PEAK]), live)
            return slot
        return self._wait_claim(self._free, _FREE_WAITS, take, abort, timeout_s)

    def writable_segment(self, slot: int, shapes: Sequence[tuple[int, int]]) -> SegmentView:
        """Writable views of the FILLING slot's segment, laid out for arrays of ``shapes``.

        The slot's segment is reused when it has the right size (no page is faulted again: in
        steady state this costs nothing), and made, or resized, otherwise: then it is created
        if needed, truncated to the size, mapped and pre-faulted in one ``MADV_POPULATE_WRITE``.
        The producer writes the partition straight into ``view.arrays`` and then calls
        :meth:`publish` (or :meth:`abandon`).
        """
        self._check_owner(slot, FILLING)
        layout, size = array_offsets(shapes)
        with self._locked():
            gen, held = int(self._slots["gen"][slot]), int(self._slots["nbytes"][slot])
            if held != size:  # remade: every process's mapping of the old one is stale from now on
                gen += 1
                self._slots["gen"][slot], self._slots["nbytes"][slot] = gen, size
                self._header[_MADE] += 1
        buf = self._mapping(slot, gen, size, writable=True)
        arrays = [np.ndarray((rows, cols), np.uint64, buffer=buf, offset=off) for off, rows, cols in layout]
        return SegmentView(buf, b"", arrays, layout)

    def publish(self, slot: int, segment: SegmentView, meta: bytes) -> None:
        """Write ``meta`` into the segment's header, drop the views, FILLING -> READY, then post ``ready``.

        Order matters (kept consistent with :meth:`take_ready`): the header is complete
        and the record says READY before the token exists, so a woken consumer always
        finds a whole segment.
        """
        segment.write_header(meta)
        segment.close()
        with self._locked():
            self._check_owner(slot, FILLING)
            self._slots["state"][slot] = READY
            self._slots["t_ready"][slot] = time.monotonic()
            self._header[_PUBLISHED] += 1
        self._ready.release()

    def abandon(self, slot: int) -> None:
        """A producer gives its FILLING slot back (failed or cancelled task): FREE, post ``free``.

        Idempotent: a slot already reclaimed or freed is left alone. The segment stays for the next user.
        """
        self._free_where(lambda r: r.slot == slot and r.state == "filling" and r.owner_pid == os.getpid())

    # ---- consumer side (prover process)
    def take_ready(self, abort: Callable[[], bool], timeout_s: float | None = None,
                   max_nbytes: int | None = None) -> SlotRecord | None:
        """Block until a slot is READY; take the oldest (priority, job, partition) one (STAGING, owner = me);
        with ``max_nbytes``, only a slot whose segment is at most that big.

        The consumer of a token is not always the one that takes a slot (see the
        module docstring); the control block decides, under the lock.
        """
        def take() -> int | None:
            ready_mask = self._slots["state"] == READY
            if max_nbytes is not None:
                ready_mask &= self._slots["nbytes"] <= max_nbytes
            ready = np.flatnonzero(ready_mask)
            if not ready.size:
                return None
            rec = self._slots[ready]
            order = np.lexsort((rec["task_id"], rec["partition"], rec["job_seq"], rec["priority"]))
            slot = int(ready[order[0]])
            self._slots["state"][slot] = STAGING
            self._slots["owner_pid"][slot] = os.getpid()
            return slot
        slot = self._wait_claim(self._ready, _READY_WAITS, take, abort, timeout_s)
        return None if slot is None else self.record(slot)

    def open_segment(self, slot: int) -> SegmentView:
        """The meta and array views of a taken (STAGING) slot's segment, from this process's mapping
        of it (mapped, and its pages populated, the first time this process sees this generation).

        Cancelled where it must be mapped and its name is gone: only a stopping engine unlinks the
        segment of a slot in use (:mod:`.engine`), whose jobs have failed already."""
        self._check_owner(slot, STAGING)
        with self._locked():
            gen, size = int(self._slots["gen"][slot]), int(self._slots["nbytes"][slot])
        try:
            buf = self._mapping(slot, gen, size, writable=False)
        except posix_ipc.ExistentialError:
            raise Cancelled(f"ring {self.handle.prefix} slot {slot}: its segment is gone (the engine is "
                            "stopping)") from None
        n = int.from_bytes(buf[:8], "little")
        layout = msgspec.msgpack.decode(buf[8 : 8 + n], type=SegmentLayout)
        arrays = [np.ndarray((rows, cols), np.uint64, buffer=buf, offset=off) for off, rows, cols in layout.arrays]
        return SegmentView(buf, layout.meta, arrays, layout.arrays)

    def release(self, slot: int) -> None:
        """The consumer is done copying: mark the slot FREE (its segment stays), post ``free``."""
        self._free_where(lambda r: r.slot == slot and r.state == "staging" and r.owner_pid == os.getpid())

    # ---- supervisor side (engine)
    def reclaim(self, pid: int) -> list[SlotRecord]:
        """Free the FILLING/STAGING slots a dead process owned; returns their records (as they were)."""
        def mine(r: SlotRecord) -> bool:
            return r.owner_pid == pid and r.state in ("filling", "staging")
        return self._free_where(mine, reclaimed=True)

    def drop_ready(self, task_ids: set[int]) -> list[SlotRecord]:
        """Free READY slots holding these tasks (cancelled jobs); returns their records."""
        return self._free_where(lambda r: r.state == "ready" and r.task_id in task_ids)

    def trim(self, idle_s: float = TRIM_IDLE_S) -> list[int]:
        """Truncate and unlink the segment of every slot FREE for ``idle_s`` or more; the slots trimmed.

        Truncation returns the pages to the system at once, even while another process still maps
        the segment: that mapping's generation is stale (bumped here, under the lock), so it is
        never read or written again. Unlinking happens under the lock, so a producer that claims
        the slot afterwards makes a new segment under the same name; the truncation runs outside it.
        """
        now = time.monotonic()
        doomed: list[tuple[int, int | None]] = []
        with self._locked():
            for slot in range(self.handle.n_slots):
                r = self._slots[slot]
                if int(r["state"]) != FREE or int(r["nbytes"]) == 0 or now - float(r["t_free"]) < idle_s:
                    continue
                self._slots["gen"][slot] += 1
                self._slots["nbytes"][slot] = 0
                fd = open_segment_fd(self._name(slot))
                unlink_segment(self._name(slot))
                doomed.append((slot, fd))
            self._header[_TRIMMED] += len(doomed)
        for slot, fd in doomed:
            self._unmap(slot)
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)
                finally:
                    os.close(fd)
        return [slot for slot, _ in doomed]

    def snapshot(self) -> list[SlotRecord]:
        """Every slot's record, read under the lock."""
        with self._locked():
            return [self._record(s) for s in range(self.handle.n_slots)]

    def stats(self) -> RingStats:
        """The ring's counters (see :class:`RingStats`); a closed ring's are those it had at its close, so
        what reports them (the engine's metrics, read until its daemon exits) never sees them go back."""
        if self._closed:
            return self._final
        with self._locked():
            h = [int(x) for x in self._header]
            live = int(np.count_nonzero(self._slots["state"] != FREE))
            held = self._slots["nbytes"][self._slots["nbytes"] > 0]
        return _stats_of(h, live, held)

    def record(self, slot: int) -> SlotRecord:
        """A copy of one slot's record."""
        with self._locked():
            return self._record(slot)

    # ---- internals
    def _mapping(self, slot: int, gen: int, size: int, *, writable: bool) -> mmap.mmap:
        """This process's mapping of the slot's segment at generation ``gen`` (the caller owns the slot)."""
        with self._mlock:
            have = self._maps.get(slot)
            if have is not None and have.gen == gen and have.size == size:
                return have.buf
            self._unmap_locked(slot)
            buf = map_segment(self._name(slot), size, create=writable)
            self._maps[slot] = SegmentMapping(gen, size, buf)
            return buf

    def _unmap(self, slot: int) -> None:
        """Unmap this process's mapping of a slot's segment. The slot's arrays are made with
        ``np.ndarray(buffer=...)``, which holds no buffer export: the close unmaps the memory under any
        of them still alive, so no thread of this process may touch a slot's arrays after handing the
        slot on (publishing or releasing it): its mapping is closed when the slot is trimmed or remade."""
        with self._mlock:
            self._unmap_locked(slot)

    def _unmap_locked(self, slot: int) -> None:
        have = self._maps.pop(slot, None)
        if have is not None:
            with contextlib.suppress(BufferError):
                have.buf.close()

    def _forget_stale(self) -> None:
        """Unmap the segments whose generation moved on (remade or trimmed by another process).

        Skipped while another thread of this process is mapping (it holds the lock for seconds
        when it pre-faults a big segment): the next poll catches up.
        """
        if not self._maps or not self._mlock.acquire(blocking=False):
            return
        try:
            gens = self._slots["gen"]
            for slot in [s for s, m in self._maps.items() if int(gens[s]) != m.gen]:
                self._unmap_locked(slot)
        finally:
            self._mlock.release()

    def _wait_claim(self, sem: posix_ipc.Semaphore, counter: int, take: Callable[[], int | None],
                    abort: Callable[[], bool], timeout_s: float | None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        waited = False
        while True:
            try:
                sem.acquire(0 if not waited else POLL_S)
            except (posix_ipc.BusyError, posix_ipc.SignalError):
                pass  # the time is up, or a signal (a SIGTERM to the process group) ended the wait: scan again
            with self._locked():
                slot = take()
                if slot is None and not waited:
                    self._header[counter] += 1
            if slot is not None:
                return slot
            waited = True
            self._forget_stale()
            if abort() or (deadline is not None and time.monotonic() >= deadline):
                return None

    def _set(self, slot: int, state: int, claim: SlotClaim) -> None:
        s = self._slots
        s["state"][slot], s["owner_pid"][slot] = state, os.getpid()
        s["task_id"][slot], s["job_seq"][slot] = claim.task_id, claim.job_seq
        s["partition"][slot], s["priority"][slot] = claim.partition, claim.priority
        s["t_ready"][slot] = 0.0
        s["uses"][slot] += 1

    def _free_where(self, pick: Callable[[SlotRecord], bool], reclaimed: bool = False) -> list[SlotRecord]:
        """Mark FREE every slot ``pick`` selects, under the lock (segments stay); post ``free`` for each."""
        now = time.monotonic()
        with self._locked():
            records = [r for r in (self._record(s) for s in range(self.handle.n_slots)) if pick(r)]
            for r in records:
                self._slots["state"][r.slot], self._slots["owner_pid"][r.slot] = FREE, 0
                self._slots["t_free"][r.slot] = now
            self._header[_RELEASED] += len(records)
            if reclaimed:
                self._header[_RECLAIMED] += len(records)
        for _ in records:
            self._free.release()
        return records

    def _check_owner(self, slot: int, state: int) -> None:
        got, pid = int(self._slots["state"][slot]), int(self._slots["owner_pid"][slot])
        if got != state or pid != os.getpid():
            raise RuntimeError(f"ring {self.handle.prefix} slot {slot}: expected {STATE_NAMES[state]} owned by "
                               f"pid {os.getpid()}, found {STATE_NAMES[got]} owned by pid {pid}")

    def _record(self, slot: int) -> SlotRecord:
        r = self._slots[slot]
        return SlotRecord(slot, STATE_NAMES[int(r["state"])], int(r["owner_pid"]), int(r["task_id"]),
                          int(r["job_seq"]), int(r["partition"]), int(r["priority"]), int(r["nbytes"]),
                          float(r["t_ready"]), int(r["gen"]), float(r["t_free"]))


def _stats_of(h: list[int], live: int, held: np.ndarray) -> RingStats:
    """:class:`RingStats` from the header's words ``h``, the slots in use and the held segments' sizes."""
    return RingStats(live=live, peak_live=h[_PEAK], free_waits=h[_FREE_WAITS], ready_waits=h[_READY_WAITS],
                     published=h[_PUBLISHED], released=h[_RELEASED], reclaimed=h[_RECLAIMED],
                     held=int(held.size), held_bytes=int(held.sum()), segments_made=h[_MADE], trimmed=h[_TRIMMED])
