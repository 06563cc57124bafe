"""The WAL check's fast frame checksums (:func:`cuzk_mp.daemon.journal_wal._frame_checksums`, numpy over
a batch of frames) give exactly SQLite's: against the plain recurrence (:func:`_checksum`, the oracle)
on random frames of each page size and byte order, and against the checksums SQLite wrote in a real
WAL; a WAL larger than a batch is checked whole, damage in any batch found."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.daemon import journal_wal
from cuzk_mp.daemon.journal_wal import _checksum, wal_damage
from tests.test_journal_integrity import _crash_image, _fill


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_the_frame_checksums_are_the_recurrences(order: str, page_size: int) -> None:
    """Random frames and random states before them (words of all ones included, where every sum
    wraps): each frame's (s1, s2) is the recurrence's over its first 8 bytes and then its page."""
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    count = 5
    frames = bytearray(rng.integers(0, 256, size=count * (24 + page_size), dtype=np.uint8).tobytes())
    frames[24 + 8:2 * (24 + page_size)] = b"\xff" * (2 * (24 + page_size) - 32)  # the 2nd frame: all ones
    s1 = rng.integers(0, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    s2 = rng.integers(0, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    s1[1] = s2[1] = 0xFFFFFFFF
    c1, c2 = journal_wal._frame_checksums(bytes(frames), order, page_size, s1, s2)
    for i in range(count):
        frame = frames[i * (24 + page_size):(i + 1) * (24 + page_size)]
        want = _checksum(bytes(frame[24:]), order, *_checksum(bytes(frame[:8]), order, int(s1[i]), int(s2[i])))
        assert (int(c1[i]), int(c2[i])) == want, (seed, i)


def _real_wal(tmp_path: Path, jobs: int) -> Path:
    """The WAL a SIGKILL would leave of a journal with ``jobs`` committed jobs (one transaction each)."""
    live = tmp_path / "live" / "journal.sqlite"
    live.parent.mkdir()
    j = _fill(live, jobs)
    try:
        image = _crash_image(live, tmp_path / "disk")
    finally:
        j.close()
    return Path(f"{image}-wal")


def test_the_frame_checksums_are_the_ones_sqlite_wrote(tmp_path: Path) -> None:
    """Every frame of a real WAL (SQLite's own byte order), continuing from its predecessor's stored
    checksum (the header's for the first), gets the checksum SQLite stored in it."""
    wal = _real_wal(tmp_path, 20)
    data = wal.read_bytes()
    magic, _, page_size, _, _, _, h1, h2 = struct.unpack(">8I", data[:32])
    order = "<" if magic == 0x377F0682 else ">"
    frames = data[32:]
    count = len(frames) // (24 + page_size)
    assert count >= 20
    stored = np.frombuffer(frames[:count * (24 + page_size)], dtype=">u4").reshape(count, -1)[:, 4:6].astype(np.uint32)
    s1 = np.concatenate([np.array([h1], dtype=np.uint32), stored[:-1, 0]])
    s2 = np.concatenate([np.array([h2], dtype=np.uint32), stored[:-1, 1]])
    c1, c2 = journal_wal._frame_checksums(frames[:count * (24 + page_size)], order, page_size, s1, s2)
    assert (c1 == stored[:, 0]).all() and (c2 == stored[:, 1]).all()


@pytest.mark.parametrize("frame", [1, 5, 9])
def test_damage_in_any_batch_of_a_wal_is_found(tmp_path: Path, frame: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With batches of 4 frames, a WAL of 20 jobs is read in several: a byte changed in a frame of
    the first, a middle or a later batch is found as that frame, and the intact WAL passes."""
    wal = _real_wal(tmp_path, 20)
    page_size = struct.unpack(">I", wal.read_bytes()[8:12])[0]
    monkeypatch.setattr(journal_wal, "BATCH_BYTES", 4 * (24 + page_size))
    assert wal_damage(wal) is None
    data = bytearray(wal.read_bytes())
    data[32 + frame * (24 + page_size) + 24 + 100] ^= 0x01
    wal.write_bytes(data)
    problem = wal_damage(wal)
    assert problem is not None and problem.startswith(f"frame {frame} of "), problem
    os.truncate(wal, 32 + frame * (24 + page_size) + 10)  # cut inside that frame: a torn end, not damage
    assert wal_damage(wal) is None


def test_a_large_wal_is_checked_by_batches_not_word_by_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WAL of many committed frames (SQLite's, never checkpointed) is checked in batches of frames: the
    word-by-word checksum runs for its header alone, whatever the WAL's size. Word by word it ran at ~57 MiB/s,
    and a WAL of GiBs held the start for minutes (the rates: the commit that made the batches)."""
    import shutil
    import sqlite3

    from cuzk_mp.daemon import journal_wal

    live = tmp_path / "live.sqlite"
    conn = sqlite3.connect(live, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE t (b BLOB)")
        for _ in range(16):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(1 << 18),))
        wal = tmp_path / "copy.sqlite-wal"
        shutil.copy(f"{live}-wal", wal)
    finally:
        conn.close()
    assert wal.stat().st_size > 4 << 20
    calls: list[int] = []
    word_by_word = journal_wal._checksum

    def counted(data: bytes, *args: object) -> tuple[int, int]:
        calls.append(len(data))
        return word_by_word(data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_wal, "_checksum", counted)
    assert wal_damage(wal) is None
    assert sum(calls) <= 32, calls  # the 24 bytes of the header's own checksum


def test_the_check_of_a_large_wal_is_announced_to_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WAL of at least WAL_ANNOUNCED_BYTES is read whole before the journal opens (minutes for GiBs on
    a cold disk): the step is shown to systemd with a budget for its size (notify.starting), where
    nothing was said and the start's timeout could run out. A smaller one is checked unannounced."""
    from cuzk_mp.daemon import journal, notify
    from cuzk_mp.daemon.journal import Journal

    wal = _real_wal(tmp_path, 3)
    steps: list[tuple[str, float]] = []
    monkeypatch.setattr(journal, "starting", lambda step, budget_s: steps.append((step, budget_s)) or True)
    monkeypatch.setattr(journal, "WAL_ANNOUNCED_BYTES", wal.stat().st_size + 1)
    Journal.open(wal.with_name("journal.sqlite")).close()
    assert steps == []
    (tmp_path / "again").mkdir()
    wal = _real_wal(tmp_path / "again", 3)  # the first one was checkpointed away when its journal closed
    size = wal.stat().st_size
    monkeypatch.setattr(journal, "WAL_ANNOUNCED_BYTES", size)
    Journal.open(wal.with_name("journal.sqlite")).close()
    assert steps == [(f"checking the journal's write-ahead log {wal} ({size / 2**30:.2f} GiB)",
                      notify.read_budget_s(size))]
