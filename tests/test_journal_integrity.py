"""The journal defends itself: a bad row is quarantined and the other jobs start; a journal that
is missing, emptied, swapped, not a database, failing SQLite's check, or whose write-ahead log
would silently drop committed jobs stops the start with a message (the daemon exits 65 and
changes nothing), never an empty journal in its place."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.journal import Journal, JournalDamaged, JournalEntry
from cuzk_mp.daemon.journal_wal import wal_damage
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.errors import InputError
from tests.fake_engine import run_daemon
from tests.helpers import ENV, PY, config_text


def _entry(i: int, **kw: Any) -> JournalEntry:
    return JournalEntry(job_id=f"job-{i}", request_id="", circuit_id="syn", priority=2, digest=f"d{i}",
                        partitions=synthetic_partitions(1, i), submitted_at=1000.0 + i, **kw)


def _fill(path: Path, n: int) -> Journal:
    """A journal with ``n`` queued jobs (each its own committed transaction), left open."""
    j = Journal.open(path)

    async def add() -> None:
        for i in range(n):
            await j.add(_entry(i))
    asyncio.run(add())
    return j


def _crash_image(path: Path, dest: Path) -> Path:
    """The files a SIGKILL would leave: the database and its WAL as they are now."""
    dest.mkdir()
    for suffix in ("", "-wal", ".id"):
        shutil.copy(f"{path}{suffix}", f"{dest / path.name}{suffix}")
    return dest / path.name


def test_bad_rows_are_quarantined_and_the_rest_start(tmp_path: Path) -> None:
    journal = tmp_path / "journal.sqlite"

    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            for i in range(3):
                await c.prove("syn", synthetic_partitions(1, i), request_id=f"done-{i}", timeout_s=10)
            d.engine.gate.clear()
            for i in range(4):
                await c.submit("syn", synthetic_partitions(1, 10 + i), request_id=f"open-{i}")

    run_daemon(tmp_path, first, journal=str(journal))
    db = sqlite3.connect(journal)
    with db:
        db.execute("UPDATE jobs SET partitions = x'c1c1' WHERE job_id = 'open-0'")  # undecodable
        db.execute("UPDATE jobs SET priority = 99 WHERE job_id = 'open-1'")
        db.execute("UPDATE jobs SET result = x'81a178c0' WHERE job_id = 'done-0'")  # not a JobReply
        db.execute("UPDATE jobs SET state = 'exploded' WHERE job_id = 'done-1'")
        db.execute("UPDATE jobs SET partitions = 'text' WHERE job_id = 'open-2'")
        db.execute("UPDATE jobs SET submitted_at = 'yesterday' WHERE job_id = 'done-2'")
    db.close()

    async def second(d: Daemon, addr: str) -> None:
        assert d.engine.submitted == ["open-3"]  # the one good unfinished job runs again
        async with await AsyncClient.connect(addr) as c:
            assert (await c.await_proof("open-3", timeout_s=10)).state == "done"
            for bad in ("open-0", "open-1", "done-0", "done-1", "open-2", "done-2"):
                with pytest.raises(InputError, match="unknown job"):
                    await c.await_proof(bad, 0)
            report = (await c.status())["journal"]
        assert report["quarantined"] == 6 and report["quarantined_at_start"] == 6
        reasons = {q["job_id"]: q["reason"] for q in report["quarantine"]}
        assert "priority" in reasons["open-1"] and "state" in reasons["done-1"]
        assert "submitted_at" in reasons["done-2"] and "not msgpack" in reasons["open-2"]

    run_daemon(tmp_path, second, journal=str(journal))
    db = sqlite3.connect(journal)
    rows = dict(db.execute("SELECT job_id, priority FROM quarantine").fetchall())
    assert rows["open-1"] == 99 and len(rows) == 6  # moved aside as they were
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    db.close()

    async def third(d: Daemon, addr: str) -> None:  # the quarantine stays reported, nothing new
        async with await AsyncClient.connect(addr) as c:
            report = (await c.status())["journal"]
        assert (report["quarantined"], report["quarantined_at_start"]) == (6, 0)

    run_daemon(tmp_path, third, journal=str(journal))


def test_a_result_belonging_to_another_job_is_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    j = _fill(path, 2)
    reply = P.JobReply(id=0, job_id="someone-else", circuit_id="syn", state="done", priority="NORMAL",
                       partitions=[P.PartitionOut(index=0, state="done")], submitted_at=1.0, finished_at=2.0)
    asyncio.run(j.finish("job-0", reply, _entry(0).partitions))
    assert [e.job_id for e in j.load()] == ["job-1"]
    assert "another job" in asyncio.run(j.report())["quarantine"][0]["reason"]
    j.close()


@pytest.mark.parametrize("damage, message", [
    ("truncate", "empty (0 bytes)"),
    ("delete", "missing"),
    ("garbage", "not a usable journal"),
    ("half", "malformed"),
    ("swap", "another journal was put in its place"),
])
def test_a_damaged_or_missing_journal_refuses_to_open(tmp_path: Path, damage: str, message: str) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path, 50).close()
    assert path.with_name("journal.sqlite.id").exists()
    if damage == "truncate":
        path.write_bytes(b"")
    elif damage == "delete":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"this is not a database, it is a shopping list\n" * 100)
    elif damage == "half":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    else:
        path.unlink()
        _fill(path.with_name("other.sqlite"), 1).close()
        shutil.move(path.with_name("other.sqlite"), path)
    before = path.read_bytes() if path.exists() else None
    with pytest.raises(JournalDamaged, match=re.escape(message)) as info:
        Journal.open(path)
    assert str(path) in str(info.value) and "aside" in str(info.value)
    assert (path.read_bytes() if path.exists() else None) == before  # nothing repaired or emptied


def test_a_damaged_wal_is_detected_before_sqlite_drops_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "live" / "journal.sqlite"
    path.parent.mkdir()
    j = _fill(path, 20)
    try:
        clean = _crash_image(path, tmp_path / "clean")
        middle = _crash_image(path, tmp_path / "middle")
        header = _crash_image(path, tmp_path / "header")
        torn = _crash_image(path, tmp_path / "torn")
    finally:
        j.close()
    assert wal_damage(Path(f"{clean}-wal")) is None
    for image, offset in ((middle, 32 + 3 * (24 + 4096) + 24 + 200), (header, 12), (torn, -30)):
        wal = bytearray(Path(f"{image}-wal").read_bytes())
        wal[offset] ^= 0x5A
        Path(f"{image}-wal").write_bytes(wal)
    for image in (middle, header):
        wal_before = Path(f"{image}-wal").read_bytes()
        with pytest.raises(JournalDamaged, match="write-ahead log is damaged") as info:
            Journal.open(image)
        assert "committed transactions" in str(info.value)
        assert Path(f"{image}-wal").read_bytes() == wal_before  # the evidence is kept
    reopened = Journal.open(clean)
    assert [e.job_id for e in reopened.load()] == [f"job-{i}" for i in range(20)]
    reopened.close()
    # A tear in the last transaction is what a crash mid-write leaves (never acknowledged):
    # SQLite drops it and the journal opens with the jobs before it.
    reopened = Journal.open(torn)
    assert [e.job_id for e in reopened.load()] == [f"job-{i}" for i in range(19)]
    reopened.close()


def test_a_schema_1_journal_is_migrated_with_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE,
            request_id TEXT NOT NULL, circuit_id TEXT NOT NULL, priority INTEGER NOT NULL,
            digest TEXT NOT NULL, partitions BLOB NOT NULL, submitted_at REAL NOT NULL,
            state TEXT NOT NULL, finished_at REAL, result BLOB);
        INSERT INTO meta VALUES ('schema', '1');
    """)
    db.execute("INSERT INTO jobs (job_id, request_id, circuit_id, priority, digest, partitions, submitted_at,"
               " state) VALUES ('old', '', 'syn', 2, 'd', ?, ?, 'queued')",
               (msgspec.msgpack.encode(synthetic_partitions(2)), time.time()))
    db.commit()
    db.close()
    j = Journal.open(path)
    [entry] = j.load()
    assert (entry.job_id, entry.owner, len(entry.partitions)) == ("old", "", 2)
    j.close()
    assert sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("2",)


def test_a_first_start_and_an_empty_file_without_history_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "j" / "journal.sqlite"
    Journal.open(path).close()
    assert path.with_name("journal.sqlite.id").read_text().strip()
    other = tmp_path / "touched.sqlite"
    other.write_bytes(b"")  # e.g. created by hand or by a crash before the first write
    j = Journal.open(other)
    assert j.load() == []
    j.close()


def test_the_daemon_refuses_a_damaged_journal_with_exit_65_touching_nothing(tmp_path: Path) -> None:
    prefix = "cuzk-jd-test"
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix))
    _fill(tmp_path / "journal.sqlite", 3).close()
    (tmp_path / "journal.sqlite").write_bytes(b"")
    proc = subprocess.run([*PY, "daemon", "--config", str(cfg)], env=ENV, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 65, proc.stderr
    assert "refusing to start" in proc.stderr and "empty (0 bytes)" in proc.stderr
    assert "Traceback" not in proc.stderr
    last = json.loads(proc.stderr.strip().splitlines()[-1])  # [logging] format = "json": its last line too
    assert last["level"] == "error" and last["exit_code"] == 65 and last["msg"].startswith("refusing to start")
    assert not (tmp_path / "cuzk.sock").exists() and not (tmp_path / "keys").exists()
    assert (tmp_path / "journal.sqlite").read_bytes() == b""


def test_a_full_disk_is_not_a_damaged_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's "database or disk is full" while the journal is opened is a ResourceError (exit 4,
    which systemd retries) that changes nothing, not the JournalDamaged that tells the operator to
    move the journal (and its jobs) aside; once there is room the same journal opens."""
    from cuzk_mp.errors import ResourceError

    real = sqlite3.connect

    def full(*args: Any, **kwargs: Any) -> sqlite3.Connection:  # no page beyond the file's own: a full disk
        conn = real(*args, **kwargs)
        conn.execute("PRAGMA max_page_count = 1")
        return conn

    path = tmp_path / "journal.sqlite"
    monkeypatch.setattr(sqlite3, "connect", full)
    with pytest.raises(ResourceError, match=r"journal.sqlite: the journal cannot be opened now \(database or disk "
                                            r"is full\); it was not changed"):
        Journal.open(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the journal it made nor an .id
    monkeypatch.setattr(sqlite3, "connect", real)
    j = _fill(path, 2)
    assert len(j.load()) == 2
    j.close()


@pytest.mark.parametrize("lock_there", [True, False])
def test_a_daemon_whose_param_cache_is_full_at_the_start_leaves_no_empty_journal(tmp_path: Path,
                                                                                 lock_there: bool) -> None:
    """A daemon started with its journal in a param cache whose file system is full (a small tmpfs in a
    private mount namespace, filled): with its lock file already there, it ended (exit 4) leaving an
    empty ``journal.sqlite``, and its message did not say where the disk is full; without one (no room
    even for the pid the lock file records, for messages only) it ended with exit 1 and "No space left
    on device", naming no file. Now the lock is taken without its pid where there is no room for it, the
    journal the start made is removed, and the start ends with exit 4 naming the full folder. Skipped,
    saying so, where no mount namespace can be made."""
    import sys

    from tests.helpers import on_small_tmpfs

    cache = tmp_path / "cache"
    cache.mkdir()
    config = tmp_path / "d.toml"
    config.write_text(config_text(tmp_path, tmp_path / "keys", prefix=f"cuzk-jfull-{os.getpid()}").replace(
        f'journal = "{tmp_path}/journal.sqlite"', f'journal = "{cache}/journal.sqlite"'))
    lock = f"echo 1 > {cache}/journal.sqlite.lock; " if lock_there else ""
    script = (f"{lock}dd if=/dev/zero of={cache}/filler bs=4096 2>/dev/null; "
              f"{sys.executable} -m cuzk_mp daemon --config {config}; code=$?; ls -A {cache}; exit $code")
    proc = on_small_tmpfs(cache, 64 << 10, script, timeout=60)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 4, (proc.returncode, proc.stderr[-3000:])
    assert f"{cache}/journal.sqlite: " in last and f"the file system of {cache} is full" in last, last
    assert proc.stdout.split() == ["filler", "journal.sqlite.lock"], proc.stdout


def test_a_new_journal_is_its_owners_alone(tmp_path: Path) -> None:
    """The journal holds the witnesses of unfinished jobs: it and its write-ahead files are made 0600
    whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        j = _fill(tmp_path / "journal.sqlite", 1)
    finally:
        os.umask(old)
    for name in ("journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    j.close()


def test_pruned_jobs_give_their_space_back(tmp_path: Path) -> None:
    """A journal that held many big jobs does not keep its peak size once they are pruned."""
    from cuzk_mp.daemon import protocol as proto

    path = tmp_path / "journal.sqlite"
    j = Journal.open(path)
    big = [proto.PartitionIn("wtns", b"wtns" + bytes(200_000))]

    async def fill_then_prune() -> None:
        for i in range(40):
            await j.add(msgspec.structs.replace(_entry(i), partitions=big))
        j._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        peak = path.stat().st_size
        await j.remove([f"job-{i}" for i in range(40)])
        j._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert path.stat().st_size < peak // 4, (path.stat().st_size, peak)

    asyncio.run(fill_then_prune())
    assert j.load() == []
    j.close()


def test_a_journal_made_without_incremental_vacuum_is_converted_once(tmp_path: Path) -> None:
    """A journal from before incremental vacuum (SQLite's default mode, which never shrinks the file)
    is rewritten into that mode on open, its jobs kept, so pruning gives its space back from then on."""
    from cuzk_mp.daemon import protocol as proto

    path = tmp_path / "journal.sqlite"
    j = _fill(path, 3)
    j.close()
    conn = sqlite3.connect(path)  # as an older daemon left it: auto_vacuum NONE
    conn.execute("PRAGMA auto_vacuum=NONE")
    conn.execute("VACUUM")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    j = Journal.open(path)
    assert j._conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert sorted(e.job_id for e in j.load()) == ["job-0", "job-1", "job-2"]
    big = [proto.PartitionIn("wtns", b"wtns" + bytes(200_000))]

    async def fill_then_prune() -> None:
        for i in range(10, 40):
            await j.add(msgspec.structs.replace(_entry(i), partitions=big))
        j._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        peak = path.stat().st_size
        await j.remove([f"job-{i}" for i in range(10, 40)])
        j._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert path.stat().st_size < peak // 4, (path.stat().st_size, peak)

    asyncio.run(fill_then_prune())
    j.close()


@pytest.mark.parametrize("linked", [False, True])
@pytest.mark.parametrize("removed", ["the database file alone", "the journal's files", "its folder"])
def test_a_journal_removed_under_the_running_daemon_is_written_again_with_every_job(
        tmp_path: Path, removed: str, linked: bool) -> None:
    """The journal (or the whole param cache it lies in) removed while the daemon runs (a cleaner of
    old files, an operator's ``rm``): SQLite goes on writing into the unlinked file, so every job it
    held, and every job accepted after, was lost at the next start (which refused: its .id says a
    journal was there). The next write finds the path gone and writes the journal there again from
    the open database, its .id beside it: a later start has every job. A journal path that is a link
    (to a journal on a disk of the operator's choice) whose file was removed: the journal was written
    as a regular file in the link's place; it is written where the link leads, the link kept."""
    path = tmp_path / "cache" / "journal.sqlite"
    place = tmp_path / "disk" / "journal.sqlite" if linked else path  # where the journal's file lies
    if linked:
        place.parent.mkdir()
        path.parent.mkdir()
        place.touch(0o600)  # a link that leads nowhere is refused at the start
        path.symlink_to(place)
    j = _fill(path, 3)
    if removed == "its folder":
        shutil.rmtree(place.parent)
    elif removed == "the database file alone":  # its -wal and -shm stay: the open journal's own
        place.unlink()
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{place}{suffix}").unlink(missing_ok=True)
        Path(f"{path}.id").unlink()

    async def more() -> None:
        await j.add(_entry(3))
        await j.finish("job-0", P.JobReply(id=0, job_id="job-0", circuit_id="syn", state="cancelled",
                                           priority="NORMAL", partitions=[P.PartitionOut(index=0, state="cancelled")],
                                           submitted_at=1000.0, finished_at=2000.0), _entry(0).partitions)
    asyncio.run(more())
    j.close()
    reopened = Journal.open(path)
    try:
        entries = {e.job_id: e for e in reopened.load()}
    finally:
        reopened.close()
    assert sorted(entries) == ["job-0", "job-1", "job-2", "job-3"]
    assert entries["job-0"].state == "cancelled"
    assert oct(place.stat().st_mode & 0o777) == oct(0o600)
    assert place.is_file() and not place.is_symlink()
    if linked:
        assert path.is_symlink() and Path(os.readlink(path)) == place
        assert sorted(p.name for p in path.parent.iterdir()) == ["journal.sqlite", "journal.sqlite.id"]


def test_a_file_put_in_the_running_journals_place_is_not_overwritten(tmp_path: Path) -> None:
    """Another file renamed into the journal's path while the daemon runs (a backup restored too
    early) is left as it is: writes are refused naming the journal (ResourceError, the submit's
    exit 4), and the daemon's restart decides which journal it runs with."""
    from cuzk_mp.errors import ResourceError

    path = tmp_path / "journal.sqlite"
    j = _fill(path, 1)
    other = tmp_path / "other"
    other.write_bytes(b"someone else's file")
    other.replace(path)
    with pytest.raises(ResourceError, match=r"another file was put in the journal's place"):
        asyncio.run(j.add(_entry(1)))
    j.close()
    assert path.read_bytes() == b"someone else's file"


def test_a_daemon_whose_param_cache_was_removed_keeps_every_job_across_its_restart(tmp_path: Path) -> None:
    """The daemon's side of the journal written again: the param cache folder holding the journal
    removed under a running daemon, which then accepts one more job and stops; the next daemon has
    the done job's result and runs the unfinished ones again."""
    journal = tmp_path / "state" / "journal.sqlite"

    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            await c.prove("syn", synthetic_partitions(1, 0), request_id="done-0", timeout_s=10)
            d.engine.gate.clear()
            await c.submit("syn", synthetic_partitions(1, 1), request_id="open-0")
            shutil.rmtree(journal.parent)
            await c.submit("syn", synthetic_partitions(1, 2), request_id="open-1")

    run_daemon(tmp_path, first, journal=str(journal))
    assert journal.exists() and Path(f"{journal}.id").exists()

    async def second(d: Daemon, addr: str) -> None:
        assert d.engine.submitted == ["open-0", "open-1"]
        async with await AsyncClient.connect(addr) as c:
            assert (await c.await_proof("done-0", 0)).state == "done"
            for job in ("open-0", "open-1"):
                assert (await c.await_proof(job, timeout_s=10)).state == "done"

    run_daemon(tmp_path, second, journal=str(journal))
