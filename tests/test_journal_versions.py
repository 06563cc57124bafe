"""The journal across versions: a daemon upgraded in place keeps every job of the journal an earlier
release wrote, and a daemon rolled back to an earlier release reads every job this one wrote.

The earlier releases are not installed here; their side is written out in this file: the journal's
tables as they made them (schema 2, before ``key_digest``) and the way they read a row: the columns
they select, and a JobReply decoded strictly, refusing a field they do not know (which quarantined
every job whose stored reply had one)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import msgspec

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import synthetic_partitions
from cuzk_mp.daemon.journal import Journal, JournalEntry
from tests.helpers import REPLY_FIELDS_BEFORE_KEY_DIGEST

# What the releases before key_digest select from a row.
EARLIER_COLUMNS = ("seq, job_id, request_id, circuit_id, priority, digest, partitions, submitted_at, state,"
                   " finished_at, result, owner")
EARLIER_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE,
    request_id TEXT NOT NULL, circuit_id TEXT NOT NULL, priority INTEGER NOT NULL, digest TEXT NOT NULL,
    partitions BLOB NOT NULL, submitted_at REAL NOT NULL, state TEXT NOT NULL, finished_at REAL,
    result BLOB, owner TEXT NOT NULL DEFAULT '');
CREATE TABLE quarantine (seq, job_id, request_id, circuit_id, priority, digest, partitions, submitted_at,
    state, finished_at, result, owner, reason TEXT NOT NULL, quarantined_at REAL NOT NULL);
INSERT INTO meta VALUES ('schema', '2');
INSERT INTO meta VALUES ('journal_id', 'earlier');
"""


def _reply(job_id: str, state: str, key_digest: str | None = None) -> P.JobReply:
    done = state == "done"
    return P.JobReply(id=0, job_id=job_id, circuit_id="syn", state=state, priority="NORMAL",  # type: ignore[arg-type]
                      partitions=[P.PartitionOut(index=0, state="done" if done else "failed",
                                                 proof={"pi_a": ["1"]} if done else None,
                                                 public=["7"] if done else [])],
                      submitted_at=1.0, started_at=2.0, finished_at=3.0,
                      error=None if done else "boom", error_kind=None if done else "ProofError",
                      key_digest=key_digest)


def _entry(job_id: str) -> JournalEntry:
    return JournalEntry(job_id=job_id, request_id="", circuit_id="syn", priority=2, digest="d",
                        partitions=synthetic_partitions(1), submitted_at=time.time())


def test_an_earlier_release_reads_every_job_this_one_finished(tmp_path: Path) -> None:
    """A done job's reply names its key (key_digest); the stored reply must still be one the releases
    before key_digest decode, or a daemon rolled back to one quarantines every done job."""
    path = tmp_path / "journal.sqlite"
    j = Journal.open(path)

    async def write() -> None:
        for job_id, state in (("done", "done"), ("failed", "failed"), ("queued", None)):
            await j.add(_entry(job_id))
            if state:
                await j.finish(job_id, _reply(job_id, state, "ab" * 16 if state == "done" else None),
                               [P.PartitionIn(kind="synthetic", seed=0)])
    asyncio.run(write())
    j.close()

    conn = sqlite3.connect(path)
    rows = conn.execute(f"SELECT {EARLIER_COLUMNS} FROM jobs ORDER BY seq").fetchall()
    conn.close()
    assert [r[1] for r in rows] == ["done", "failed", "queued"]
    for row in rows:
        if row[10] is not None:
            stored = msgspec.msgpack.decode(row[10])
            assert set(stored) <= REPLY_FIELDS_BEFORE_KEY_DIGEST, (row[1], set(stored) - REPLY_FIELDS_BEFORE_KEY_DIGEST)

    j = Journal.open(path)  # and this release reads its key back
    by_id = {e.job_id: e for e in j.load()}
    j.close()
    assert by_id["done"].result is not None and by_id["done"].result.key_digest == "ab" * 16
    assert by_id["failed"].result is not None and by_id["failed"].result.key_digest is None


def test_a_journal_of_an_earlier_release_opens_with_its_jobs_and_stays_readable_to_it(tmp_path: Path) -> None:
    """Upgrade then rollback: the earlier release's journal (schema 2, no key_digest column) opens with
    every job; a job this release finishes in it is still read by the earlier release's select."""
    path = tmp_path / "journal.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(EARLIER_SCHEMA)
    enc = msgspec.msgpack.encode
    conn.execute("INSERT INTO jobs (job_id, request_id, circuit_id, priority, digest, partitions, submitted_at,"
                 " state, finished_at, result) VALUES ('was-done', '', 'syn', 2, 'd', ?, 1.0, 'done', 3.0, ?)",
                 (enc(synthetic_partitions(1)), enc(_reply("was-done", "done"))))
    conn.execute("INSERT INTO jobs (job_id, request_id, circuit_id, priority, digest, partitions, submitted_at,"
                 " state) VALUES ('was-queued', '', 'syn', 2, 'd', ?, 1.0, 'queued')",
                 (enc(synthetic_partitions(1)),))
    conn.commit()
    conn.close()
    path.with_name("journal.sqlite.id").write_text("earlier\n")

    j = Journal.open(path)
    by_id = {e.job_id: e for e in j.load()}
    assert set(by_id) == {"was-done", "was-queued"}
    assert by_id["was-done"].state == "done" and by_id["was-queued"].state == "queued"
    asyncio.run(j.finish("was-queued", _reply("was-queued", "done", "cd" * 16), synthetic_partitions(1)))
    j.close()

    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("2",)
    rows = {r[1]: r for r in conn.execute(f"SELECT {EARLIER_COLUMNS} FROM jobs").fetchall()}
    conn.close()
    assert set(msgspec.msgpack.decode(rows["was-queued"][10])) <= REPLY_FIELDS_BEFORE_KEY_DIGEST
    j = Journal.open(path)
    by_id = {e.job_id: e for e in j.load()}
    j.close()
    assert by_id["was-queued"].result is not None and by_id["was-queued"].result.key_digest == "cd" * 16


def test_a_journal_an_earlier_release_made_readable_to_others_becomes_its_owners_alone(tmp_path: Path) -> None:
    """The releases before owner-only journals made the file (and SQLite its -wal and -shm) by the
    umask: 0644, or 0640 under the unit's UMask=0027, and it holds the witnesses of unfinished jobs.
    An upgraded daemon gives the journal it opens the mode a new one has."""
    import os
    import stat

    path = tmp_path / "journal.sqlite"
    j = Journal.open(path)
    asyncio.run(j.add(_entry("queued")))
    names = ("journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm")
    for name in names:
        os.chmod(tmp_path / name, 0o644)
    j.close()
    j = Journal.open(path)
    assert [e.job_id for e in j.load()] == ["queued"]
    for name in names:
        if (tmp_path / name).exists():
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    j.close()


def test_done_jobs_an_earlier_release_quarantined_come_back_when_this_one_opens_the_journal(tmp_path: Path) -> None:
    """Rolled back, a release before key_digest quarantined the done jobs whose stored reply carried it
    (as the releases that stored it inside the reply wrote them): moved, whole, into the quarantine
    table. Upgraded again, this release reads those rows: they are moved back, each job answering with
    its proofs and key_digest again, and stored so that the earlier release reads them from then on. A
    quarantined row whose job id is in use again, or that this release cannot read either, stays."""
    path = tmp_path / "journal.sqlite"
    j = Journal.open(path)
    asyncio.run(j.add(_entry("quarantined-done")))
    asyncio.run(j.add(_entry("unreadable")))
    asyncio.run(j.add(_entry("reused")))
    j.close()
    conn = sqlite3.connect(path)
    inside = msgspec.msgpack.encode(_reply("quarantined-done", "done", "ab" * 16))  # key_digest in the reply
    conn.execute("UPDATE jobs SET state='done', finished_at=3.0, result=? WHERE job_id='quarantined-done'", (inside,))
    conn.execute("UPDATE jobs SET priority=9 WHERE job_id='unreadable'")
    for job_id in ("quarantined-done", "unreadable", "reused"):  # what an earlier release's quarantine does
        conn.execute(f"INSERT INTO quarantine SELECT {EARLIER_COLUMNS}, 'ValidationError', 5.0 FROM jobs "
                     "WHERE job_id=?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE job_id=?", (job_id,))
    conn.commit()
    conn.close()
    j = Journal.open(path)
    asyncio.run(j.add(_entry("reused")))  # submitted again after the quarantine
    j.close()

    j = Journal.open(path)
    by_id = {e.job_id: e for e in j.load()}
    report = asyncio.run(j.report())
    j.close()
    assert set(by_id) == {"quarantined-done", "reused"}
    done = by_id["quarantined-done"]
    assert done.state == "done" and done.result is not None and done.result.key_digest == "ab" * 16
    assert done.result.partitions[0].public == ["7"] and by_id["reused"].state == "queued"
    assert sorted(q["job_id"] for q in report["quarantine"]) == ["reused", "unreadable"]
    conn = sqlite3.connect(path)
    [(result,)] = conn.execute("SELECT result FROM jobs WHERE job_id='quarantined-done'").fetchall()
    conn.close()
    assert set(msgspec.msgpack.decode(result)) <= REPLY_FIELDS_BEFORE_KEY_DIGEST


def test_a_reply_stored_with_key_digest_inside_is_stored_apart_once_this_release_loads_it(tmp_path: Path) -> None:
    """The releases that stored key_digest inside a done job's reply left rows an earlier release would
    quarantine on a rollback; this release, loading them, stores them apart, as it writes its own."""
    path = tmp_path / "journal.sqlite"
    j = Journal.open(path)
    asyncio.run(j.add(_entry("inside")))
    j.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE jobs SET state='done', finished_at=3.0, result=? WHERE job_id='inside'",
                 (msgspec.msgpack.encode(_reply("inside", "done", "ab" * 16)),))
    conn.commit()
    conn.close()
    j = Journal.open(path)
    [entry] = j.load()
    j.close()
    assert entry.result is not None and entry.result.key_digest == "ab" * 16
    conn = sqlite3.connect(path)
    [(result, key_digest)] = conn.execute("SELECT result, key_digest FROM jobs").fetchall()
    conn.close()
    assert set(msgspec.msgpack.decode(result)) <= REPLY_FIELDS_BEFORE_KEY_DIGEST and key_digest == "ab" * 16
