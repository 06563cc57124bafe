"""The slot ring: round trip, ordering, backpressure, crash reclaim, segment reuse and trimming,
cleanup (no engine involved).

A producer claims a free slot, gets its segment's views and writes into them (:func:`_put` does
the three steps a synthesis worker does), then publishes it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from cuzk_mp.pipeline import ring as ringmod
from cuzk_mp.pipeline import segment as segmod
from cuzk_mp.pipeline.ring import Ring, RingHandle, SlotClaim
from cuzk_mp.pipeline.shm_names import cleanup_stale, live_segments, shm_bytes, shm_entries

SEED = 20261130


@pytest.fixture
def prefix() -> str:
    name = f"cuzk-test-ring-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    yield name
    cleanup_stale(name)


def _never() -> bool:
    return False


def _claim(task: int, job: int = 0, part: int = 0, prio: int = 2) -> SlotClaim:
    return SlotClaim(task_id=task, job_seq=job, partition=part, priority=prio)


def _put(ring: Ring, slot: int, meta: bytes, arrays: list[np.ndarray], publish: bool = True) -> int:
    """Write ``arrays`` into the claimed slot's segment views, publish; the segment's size."""
    seg = ring.writable_segment(slot, [a.shape for a in arrays])
    for dst, src in zip(seg.arrays, arrays):
        dst[:] = src
    size = seg.nbytes
    if publish:
        ring.publish(slot, seg, meta)
    else:
        seg.close()
    return size


def _arrays(rng: np.random.Generator, rows: int) -> list[np.ndarray]:
    return [rng.integers(0, 2**63, (rows, 4), dtype=np.uint64) for _ in range(3)] + [
        rng.integers(0, 2**63, (rows // 2 + 3, 4), dtype=np.uint64)]


def test_round_trip_then_reuse_then_trim(prefix: str) -> None:
    print("seed", SEED)
    rng = np.random.default_rng(SEED)
    ring = Ring.create(prefix, 2)
    name = ring.handle.prefix
    assert name.startswith(f"{prefix}.") and len(name) == len(prefix) + 9  # the prefix and this ring's token
    assert sorted(shm_entries(prefix)) == sorted([f"{name}-ctl", f"sem.{name}-free", f"sem.{name}-ready"])
    assert shm_entries(name) == shm_entries(prefix)
    arrays = _arrays(rng, 1000)
    slot = ring.acquire_free(_claim(7, job=3, part=1), _never)
    assert slot is not None and ring.record(slot).state == "filling"
    seg = ring.writable_segment(slot, [a.shape for a in arrays])
    assert live_segments(prefix) == 1 and ring.record(slot).nbytes == seg.nbytes
    for dst, src in zip(seg.arrays, arrays):
        dst[:] = src  # the producer writes straight into the segment
    size = seg.nbytes
    assert size >= sum(a.nbytes for a in arrays) and size == segmod.segment_bytes([a.shape for a in arrays])
    address = seg.arrays[0].ctypes.data
    ring.publish(slot, seg, b"meta-bytes")
    other = Ring.attach(ring.handle)
    rec = other.take_ready(_never, timeout_s=1.0)
    assert rec is not None and (rec.slot, rec.task_id, rec.job_seq, rec.partition) == (slot, 7, 3, 1)
    with other.open_segment(rec.slot) as seg:
        assert seg.meta == b"meta-bytes"
        consumer_address = seg.arrays[0].ctypes.data
        copies = [np.array(a) for a in seg.arrays]
    for got, want in zip(copies, arrays):
        np.testing.assert_array_equal(got, want)
    other.release(rec.slot)
    # the slot is free again; its segment stays, pages and all, for the next partition
    assert live_segments(prefix) == 1 and ring.record(slot).state == "free" and ring.record(slot).nbytes == size
    stats = ring.stats()
    assert (stats.published, stats.released, stats.peak_live, stats.live) == (1, 1, 1, 0)
    assert (stats.held, stats.held_bytes, stats.segments_made) == (1, size, 1)

    # the next partition of the same size: the same slot (warm in this process), the same segment
    # and mapping, no first touch; the consumer reads the new bytes through its kept mapping
    again = _arrays(rng, 1000)
    assert ring.acquire_free(_claim(8, job=3, part=2), _never, nbytes=size) == slot
    seg = ring.writable_segment(slot, [a.shape for a in again])
    assert seg.arrays[0].ctypes.data == address  # the very same mapping: nothing faulted again
    for dst, src in zip(seg.arrays, again):
        dst[:] = src
    ring.publish(slot, seg, b"second")
    rec = other.take_ready(_never, timeout_s=1.0)
    with other.open_segment(rec.slot) as seg:
        assert seg.meta == b"second" and seg.arrays[0].ctypes.data == consumer_address
        for got, want in zip(seg.arrays, again):
            np.testing.assert_array_equal(got, want)
    other.release(rec.slot)
    assert ring.stats().segments_made == 1 and live_segments(prefix) == 1

    # trimming: nothing while the slot has not idled long enough, then the segment goes and its pages
    # with it, although the other process still maps it
    assert ring.trim(idle_s=60) == [] and live_segments(prefix) == 1
    held = shm_bytes(prefix)
    assert ring.trim(idle_s=0) == [slot]
    assert live_segments(prefix) == 0 and shm_bytes(prefix) <= held - size + segmod.ALIGN
    stats = ring.stats()
    assert (stats.held, stats.held_bytes, stats.trimmed) == (0, 0, 1)
    # a trimmed slot works as before: a new segment, and the consumer maps the new one
    assert ring.acquire_free(_claim(9), _never, nbytes=size) is not None
    _put(ring, slot, b"third", again)
    rec = other.take_ready(_never, timeout_s=1.0)
    with other.open_segment(rec.slot) as seg:
        assert seg.meta == b"third"
        np.testing.assert_array_equal(seg.arrays[3], again[3])
    other.release(rec.slot)
    assert ring.stats().segments_made == 2
    other.close()
    ring.destroy()
    assert shm_entries(prefix) == []


def test_unlinked_names_leave_attached_processes_working(prefix: str) -> None:
    """A stopping engine unlinks its ring's names while its provers run: what a process has open or
    mapped keeps working; a segment it has not mapped yet cannot be opened, and its partition is given
    up as cancelled (the slot freed all the same)."""
    from cuzk_mp.errors import Cancelled

    rng = np.random.default_rng(SEED)
    ring = Ring.create(prefix, 2)
    other = Ring.attach(ring.handle)
    arrays = _arrays(rng, 100)
    slot = ring.acquire_free(_claim(1), _never)
    _put(ring, slot, b"mapped", arrays)
    rec = other.take_ready(_never, timeout_s=1.0)
    with other.open_segment(rec.slot) as seg:  # the consumer maps this segment now
        assert seg.meta == b"mapped"
    other.release(rec.slot)
    assert ring.acquire_free(_claim(2), _never, nbytes=segmod.segment_bytes([a.shape for a in arrays])) == slot
    _put(ring, slot, b"again", arrays)
    unmapped = ring.acquire_free(_claim(3), _never)
    _put(ring, unmapped, b"never mapped", arrays)
    assert ring.unlink() and shm_entries(prefix) == []
    rec = other.take_ready(_never, timeout_s=1.0)  # the semaphores and the control block, still open
    assert rec is not None and rec.slot == slot
    with other.open_segment(rec.slot) as seg:  # mapped before: read as ever
        assert seg.meta == b"again"
        np.testing.assert_array_equal(seg.arrays[0], arrays[0])
    other.release(rec.slot)
    rec = other.take_ready(_never, timeout_s=1.0)
    assert rec is not None and rec.slot == unmapped
    with pytest.raises(Cancelled, match="segment is gone"):
        other.open_segment(rec.slot)
    other.release(rec.slot)
    assert [r.state for r in ring.snapshot()] == ["free", "free"] and shm_entries(prefix) == []
    other.close()
    ring.destroy()


def test_take_ready_is_oldest_first(prefix: str) -> None:
    ring = Ring.create(prefix, 4)
    one = [np.zeros((4, 4), np.uint64)]
    # (priority, job_seq, partition) in a scrambled publish order; expected take order below
    keys = [(2, 5, 0), (2, 4, 1), (1, 9, 0), (2, 4, 0)]
    for task, (prio, job, part) in enumerate(keys):
        slot = ring.acquire_free(_claim(task, job, part, prio), _never)
        _put(ring, slot, b"", one)
    order = []
    for _ in keys:
        rec = ring.take_ready(_never, timeout_s=1.0)
        order.append((rec.priority, rec.job_seq, rec.partition))
        ring.release(rec.slot)
    assert order == sorted(keys)
    ring.destroy()


def test_take_ready_with_a_size_cap_leaves_bigger_segments(prefix: str) -> None:
    """A prover filling a batch of small partitions takes only segments within the cap, even where a
    bigger one is older; that one stays READY for a take without a cap."""
    ring = Ring.create(prefix, 3)
    sizes = {}
    for task, rows in enumerate((4096, 4, 8)):  # the big one first: the oldest
        slot = ring.acquire_free(_claim(task, task), _never)
        sizes[task] = _put(ring, slot, b"", [np.zeros((rows, 4), np.uint64)])
    cap = max(sizes[1], sizes[2])
    assert sizes[0] > cap
    taken = [ring.take_ready(_never, timeout_s=0, max_nbytes=cap) for _ in range(3)]
    assert [r.task_id for r in taken if r is not None] == [1, 2] and taken[2] is None
    rec = ring.take_ready(_never, timeout_s=1.0)
    assert rec is not None and rec.task_id == 0 and rec.nbytes == sizes[0]
    ring.destroy()


def test_backpressure_blocks_then_resumes(prefix: str) -> None:
    ring = Ring.create(prefix, 2)
    one = [np.zeros((4, 4), np.uint64)]
    for task in range(2):
        slot = ring.acquire_free(_claim(task), _never)
        _put(ring, slot, b"", one)
    t0 = time.monotonic()
    assert ring.acquire_free(_claim(9), _never, timeout_s=0.6) is None
    assert time.monotonic() - t0 >= 0.5
    assert ring.stats().free_waits == 1 and live_segments(prefix) == 2

    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(ring.acquire_free(_claim(10), _never, timeout_s=5.0)))
    waiter.start()
    time.sleep(0.3)
    assert not got  # still blocked
    rec = ring.take_ready(_never, timeout_s=1.0)
    ring.release(rec.slot)
    waiter.join(5.0)
    assert got == [rec.slot] and ring.record(rec.slot).task_id == 10
    assert ring.stats().peak_live == 2
    ring.destroy()


def test_abort_returns_none(prefix: str) -> None:
    ring = Ring.create(prefix, 1)
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    t0 = time.monotonic()
    assert ring.take_ready(flag.is_set) is None
    assert 0.25 <= time.monotonic() - t0 < 2.0
    ring.destroy()


def test_a_wait_a_signal_interrupts_is_a_wake_up_not_an_error(prefix: str) -> None:
    """A signal that lands on a thread waiting for a slot (the SIGTERM that ``timeout`` sends a bench's
    whole process group) ends its semaphore wait early: the wait scans again and goes on, or returns
    where it is told to stop, never failing the partition with posix_ipc's SignalError."""
    ring = Ring.create(prefix, 1)
    stop = threading.Event()
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(ring.take_ready(stop.is_set))
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test reads
            outcome.append(e)

    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    waiter = threading.Thread(target=wait)
    try:
        waiter.start()
        for _ in range(20):  # the waiter spends nearly all its time in the semaphore's wait
            time.sleep(0.02)
            signal.pthread_kill(waiter.ident or 0, signal.SIGUSR1)
        assert waiter.is_alive() and not outcome, outcome
    finally:
        stop.set()
        waiter.join(5)
        signal.signal(signal.SIGUSR1, previous)
        ring.destroy()
    assert outcome == [None]


def _fill_and_hang(handle: RingHandle, state: str, started: mp.synchronize.Event) -> None:
    ring = Ring.attach(handle)
    slot = ring.acquire_free(_claim(1), _never)
    _put(ring, slot, b"x", [np.ones((1024, 4), np.uint64)], publish=state == "staging")
    if state == "staging":
        rec = ring.take_ready(_never, timeout_s=1.0)
        ring.open_segment(rec.slot)
    started.set()
    time.sleep(60)


def _hold_lock(handle: RingHandle, started: mp.synchronize.Event) -> None:
    ring = Ring.attach(handle)
    with ring._locked():
        started.set()
        time.sleep(60)


@pytest.mark.parametrize("state", ["filling", "staging"])
def test_reclaim_after_kill(prefix: str, state: str) -> None:
    ring = Ring.create(prefix, 2)
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    child = ctx.Process(target=_fill_and_hang, args=(ring.handle, state, started))
    child.start()
    assert started.wait(60)
    assert live_segments(prefix) == 1
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    records = ring.reclaim(child.pid)
    assert [(r.state, r.task_id, r.owner_pid) for r in records] == [(state, 1, child.pid)]
    assert all(r.state == "free" for r in ring.snapshot()) and ring.stats().reclaimed == 1
    assert live_segments(prefix) == 1 and ring.stats().held == 1  # kept for the next partition...
    assert ring.trim(idle_s=0) == [records[0].slot] and live_segments(prefix) == 0  # ...until it idles
    # the ring still works: both slots can be claimed again without blocking
    assert ring.acquire_free(_claim(2), _never, timeout_s=1.0) is not None
    assert ring.acquire_free(_claim(3), _never, timeout_s=1.0) is not None
    ring.destroy()
    assert shm_entries(prefix) == []


def test_lock_is_released_when_holder_is_killed(prefix: str) -> None:
    ring = Ring.create(prefix, 1)
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(ring.handle, started))
    child.start()
    assert started.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert ring.acquire_free(_claim(1), _never, timeout_s=2.0) == 0
    ring.destroy()


def test_drop_ready_frees_cancelled(prefix: str) -> None:
    ring = Ring.create(prefix, 3)
    for task in range(3):
        slot = ring.acquire_free(_claim(task, part=task), _never)
        _put(ring, slot, b"", [np.zeros((4, 4), np.uint64)])
    dropped = ring.drop_ready({0, 2})
    assert sorted(r.task_id for r in dropped) == [0, 2] and ring.stats().live == 1
    rec = ring.take_ready(_never, timeout_s=1.0)
    assert rec.task_id == 1
    assert ring.take_ready(_never, timeout_s=0.4) is None
    ring.release(rec.slot)
    ring.destroy()


def test_cleanup_stale_and_recreate(prefix: str) -> None:
    ring = Ring.create(prefix, 1)
    slot = ring.acquire_free(_claim(1), _never)
    _put(ring, slot, b"", [np.zeros((4, 4), np.uint64)], publish=False)
    ring.close()  # the "daemon" went away without destroying the ring
    assert len(shm_entries(prefix)) == 4
    old = ring.handle.prefix
    again = Ring.create(prefix, 1)  # start-up removes the stale objects first
    new = again.handle.prefix
    assert new != old and shm_entries(old) == []
    assert sorted(shm_entries(prefix)) == sorted([f"{new}-ctl", f"sem.{new}-free", f"sem.{new}-ready"])
    assert again.record(0).state == "free"
    again.destroy()
    assert shm_entries(prefix) == []


def test_prefix_boundary(prefix: str) -> None:
    """Names are matched exactly: a prefix never claims the objects of a longer one, with or without
    a dash between (prefixes may contain dashes), nor those of another ring of its own prefix."""
    rings = {p: Ring.create(p, 1) for p in (prefix + "1", prefix + "12", prefix + "1-x", prefix + "1-0")}
    for p, ring in rings.items():
        assert all(n.removeprefix("sem.").startswith(ring.handle.prefix + "-") for n in shm_entries(p)), p
        assert len(shm_entries(p)) == 3
    own = shm_entries(rings[prefix + "1"].handle.prefix)
    assert sorted(cleanup_stale(prefix + "1")) == own and shm_entries(prefix + "1") == []
    assert [len(shm_entries(p)) for p in (prefix + "12", prefix + "1-x", prefix + "1-0")] == [3, 3, 3]
    for ring in rings.values():
        ring.destroy()


def test_a_late_cleanup_of_a_dead_ring_spares_the_next_ring_of_its_prefix(prefix: str) -> None:
    """The children of a killed engine remove their ring by its name as they leave, possibly after
    the next engine of the same prefix has made its own ring: that one must stay whole."""
    dead = Ring.create(prefix, 1)
    dead.close()  # its engine was killed; its children still hold the name
    live = Ring.create(prefix, 1)  # the restarted engine (removes the dead ring's objects)
    slot = live.acquire_free(_claim(1), _never)
    _put(live, slot, b"m", [np.ones((4, 4), np.uint64)])
    before = shm_entries(prefix)
    assert cleanup_stale(dead.handle.prefix) == []  # an orphan's last pass, late
    assert shm_entries(prefix) == before and len(before) == 4
    assert live.take_ready(lambda: False) is not None
    live.destroy()


def test_segment_layout_alignment() -> None:
    offsets, size = segmod.array_offsets([(3, 4), (1 << 12, 4)])
    starts = [o for o, _, _ in offsets]
    assert all(o % segmod.ALIGN == 0 for o in starts) and starts[0] == segmod.HEADER_BYTES
    assert size == segmod.segment_bytes([(3, 4), (1 << 12, 4)]) >= starts[1] + (1 << 12) * 32
    assert segmod.partition_segment_bytes(1 << 12, 100) == segmod.HEADER_BYTES + 3 * (1 << 17) + 4096


def test_filling_slot_is_live_and_abandon_frees_it(prefix: str) -> None:
    """A slot holds memory from the moment its producer creates the segment (before it computes)."""
    ring = Ring.create(prefix, 1)
    slot = ring.acquire_free(_claim(1), _never)
    seg = ring.writable_segment(slot, [(1 << 10, 4)])
    assert ring.stats().live == 1 and live_segments(prefix) == 1 and ring.record(slot).state == "filling"
    assert ring.acquire_free(_claim(2), _never, timeout_s=0.3) is None  # no free slot while one is FILLING
    with pytest.raises(ValueError, match="header"):
        seg.write_header(b"m" * segmod.HEADER_BYTES)  # metadata that cannot fit is refused, not truncated
    seg.close()
    ring.abandon(slot)
    ring.abandon(slot)  # idempotent
    assert ring.record(slot).state == "free" and ring.stats().live == 0
    assert ring.acquire_free(_claim(3), _never, timeout_s=1.0) == slot
    ring.destroy()


def test_a_new_size_remakes_the_segment_and_stale_mappings_are_never_used(prefix: str) -> None:
    """Partitions of another circuit resize the slot's segment; a process that mapped the old one maps
    the new one (its generation moved on), and the ring never holds more than one segment a slot."""
    rng = np.random.default_rng(SEED + 1)
    ring = Ring.create(prefix, 1)
    other = Ring.attach(ring.handle)
    seen = []
    for rows in (2000, 500, 500, 3000):
        arrays = _arrays(rng, rows)
        slot = ring.acquire_free(_claim(rows), _never, nbytes=segmod.segment_bytes([a.shape for a in arrays]))
        size = _put(ring, slot, b"m", arrays)
        assert live_segments(prefix) == 1 and ring.record(slot).nbytes == size
        assert shm_bytes(prefix) < size + 2 * segmod.HEADER_BYTES  # a shrink gave the pages past the end back
        rec = other.take_ready(_never, timeout_s=1.0)
        with other.open_segment(rec.slot) as seg:
            assert [a.shape for a in seg.arrays] == [a.shape for a in arrays]
            for got, want in zip(seg.arrays, arrays):
                np.testing.assert_array_equal(got, want)
        other.release(rec.slot)
        seen.append(ring.record(slot).gen)
    assert seen[0] < seen[1] == seen[2] < seen[3]  # remade on each change of size only
    assert ring.stats().segments_made == 3
    other.close()
    ring.destroy()


def test_producers_prefer_warm_slots_so_idle_ones_can_be_trimmed(prefix: str) -> None:
    """With one partition at a time, a 4-slot ring keeps using one slot: the other three never get a
    segment (and one that had one would idle into trimming)."""
    ring = Ring.create(prefix, 4)
    one = [np.ones((256, 4), np.uint64)]
    size = segmod.segment_bytes([a.shape for a in one])
    used = set()
    for task in range(6):
        slot = ring.acquire_free(_claim(task), _never, nbytes=size)
        used.add(slot)
        _put(ring, slot, b"", one)
        ring.release(ring.take_ready(_never, timeout_s=1.0).slot)
    assert len(used) == 1 and live_segments(prefix) == 1 and ring.stats().segments_made == 1
    ring.destroy()


def test_trim_leaves_slots_in_use_alone(prefix: str) -> None:
    ring = Ring.create(prefix, 3)
    one = [np.ones((256, 4), np.uint64)]
    filling = ring.acquire_free(_claim(1), _never)
    seg = ring.writable_segment(filling, [a.shape for a in one])
    ready = ring.acquire_free(_claim(2), _never)
    _put(ring, ready, b"", one)
    staging = ring.acquire_free(_claim(3), _never)
    _put(ring, staging, b"", one)
    ring.take_ready(_never, timeout_s=1.0)  # takes one of the two READY slots
    assert ring.trim(idle_s=0) == [] and live_segments(prefix) == 3
    seg.close()
    ring.destroy()
    assert shm_entries(prefix) == []


def test_a_full_shared_memory_tmpfs_is_a_resource_error_not_a_sigbus(prefix: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /dev/shm has no room for a segment's pages, writing them would kill the process with
    SIGBUS: no room (before, or when its pages are populated) is a ResourceError (exit 4) naming /dev/shm."""
    import errno

    from cuzk_mp.errors import ResourceError

    ring = Ring.create(prefix, 1)
    try:
        slot = ring.acquire_free(_claim(1), _never)

        real = os.statvfs

        def full(path: str) -> os.statvfs_result:  # /dev/shm with 4 KiB left
            st = real(path)
            return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 1, 1, *tuple(st)[5:]))

        monkeypatch.setattr(segmod.os, "statvfs", full)
        with pytest.raises(ResourceError, match=r"/dev/shm has no room for a ring segment of .* MiB free of"):
            ring.writable_segment(slot, [(16384, 4)])
        monkeypatch.undo()

        class Unpopulatable:
            def __len__(self) -> int:
                return 1 << 20

            def madvise(self, advice: int) -> None:
                raise OSError(errno.EFAULT, "Bad address")

        with pytest.raises(ResourceError, match="/dev/shm has no room for the pages of a ring segment"):
            segmod._populate(Unpopulatable(), write=True)  # type: ignore[arg-type]
    finally:
        ring.destroy()


def test_a_ring_that_cannot_be_made_leaves_no_descriptor_or_name(prefix: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm full when the ring's second semaphore is made: a ResourceError, its names unlinked,
    and the control block's descriptor closed (a daemon that retries must not run out of them)."""
    import errno

    import posix_ipc

    from cuzk_mp.errors import ResourceError

    real = posix_ipc.Semaphore
    calls = [0]

    def second_fails(name: str, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] % 2 == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(ringmod.posix_ipc, "Semaphore", second_fails)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        with pytest.raises(ResourceError, match="/dev/shm"):
            Ring.create(prefix, 2)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert shm_entries(prefix) == []


def test_a_segment_made_first_by_someone_else_never_gets_a_witness(prefix: str) -> None:
    """Segment names are visible in /dev/shm: a segment made ahead of the ring, open to others (mode
    0666; as root here, also given to another owner), is replaced by one of the ring's own (0600); what
    its maker mapped sees none of the partition."""
    import mmap
    import stat

    import posix_ipc

    ring = Ring.create(prefix, 1)
    name = f"/{ring.handle.prefix}-0"
    squat = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o666, size=1 << 20)
    os.fchmod(squat.fd, 0o666)
    if os.geteuid() == 0:
        os.fchown(squat.fd, 12345, 12345)
    seen = mmap.mmap(squat.fd, 1 << 20)
    os.close(squat.fd)
    slot = ring.acquire_free(_claim(1), _never)
    _put(ring, slot, b"meta", [np.full((64, 4), 7, np.uint64)])
    st = os.stat(f"/dev/shm{name}")
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert not any(seen[: 1 << 20])  # the maker's mapping is of the old, unlinked file
    seen.close()
    rec = ring.take_ready(_never, timeout_s=1.0)
    with ring.open_segment(rec.slot) as seg:
        assert seg.meta == b"meta" and int(seg.arrays[0][0, 0]) == 7
    ring.release(rec.slot)
    ring.destroy()


def test_a_segment_the_shared_memory_cannot_make_or_map_is_a_resource_error(prefix: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm with bytes to spare but no inode left (tmpfs ``nr_inodes``) refuses the segment's
    shm_open with ENOSPC, and a process without address space refuses its mmap with ENOMEM: a
    ResourceError naming /dev/shm (no inode left) or the mapping, the segment and its size, not an
    internal error "[Errno 28]" that names neither; the slot can be written once the cause is gone."""
    import errno

    import posix_ipc

    from cuzk_mp.errors import ResourceError

    ring = Ring.create(prefix, 1)
    try:
        slot = ring.acquire_free(_claim(1), _never)
        assert slot is not None
        real_open, real_statvfs, real_mmap = posix_ipc.SharedMemory, os.statvfs, segmod.mmap.mmap

        def no_inode(name: str, flags: int = 0, **kwargs: object) -> object:
            if flags & posix_ipc.O_CREAT:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_open(name, flags, **kwargs)

        def inodes_spent(path: str) -> os.statvfs_result:
            st = real_statvfs(path)
            return os.statvfs_result((*tuple(st)[:6], 0, 0, *tuple(st)[8:]))  # f_ffree = f_favail = 0

        monkeypatch.setattr(segmod.posix_ipc, "SharedMemory", no_inode)
        monkeypatch.setattr(os, "statvfs", inodes_spent)
        with pytest.raises(ResourceError, match=rf"^/dev/shm has no room for a ring segment of 0\.5 MiB "
                                                rf"\(/{prefix}\.[0-9a-f]+-0\): .* no file can be made there: "
                                                r"all of its \d+ inodes are in use \(remove what other programs"):
            ring.writable_segment(slot, [(16384, 4)])
        monkeypatch.undo()

        def no_address_space(*args: object, **kwargs: object) -> object:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

        monkeypatch.setattr(segmod.mmap, "mmap", no_address_space)
        with pytest.raises(ResourceError, match=rf"^cannot map a ring segment of 0\.5 MiB \(/{prefix}\.[0-9a-f]+-0\) "
                                                r"into memory: Cannot allocate memory"):
            ring.writable_segment(slot, [(16384, 4)])
        monkeypatch.undo()
        assert real_mmap is segmod.mmap.mmap
        _put(ring, slot, b"m", [np.ones((16384, 4), np.uint64)])
    finally:
        ring.destroy()
