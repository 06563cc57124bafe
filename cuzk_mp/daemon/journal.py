"""The job journal: every accepted job, durably, until its result is pruned.

This module owns one SQLite file (``[daemon] journal``, default ``<param_cache>/journal.sqlite``).
A job is written (and the transaction committed with ``synchronous=FULL``) *before* the submit is
acknowledged, so a job the client was told about survives a crash, a SIGKILL or a power cut. When
the job ends its row gets the final state and the reply a client would receive (msgpack of
:class:`~cuzk_mp.daemon.protocol.JobReply`), and stays until ``result_ttl`` has passed. At start-up
the daemon reads the rows back: finished ones answer AwaitProof again, unfinished ones (state
``queued``) are submitted to the engine again, in their original order.

All SQLite work runs on one dedicated thread (``cuzk-journal``), so the asyncio loop never
blocks on an fsync and writes keep their order; the async methods await that thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

import msgspec

from cuzk_mp.daemon.protocol import JobReply, PartitionIn
from cuzk_mp.errors import ConfigError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id       TEXT NOT NULL UNIQUE,
    request_id   TEXT NOT NULL,
    circuit_id   TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    digest       TEXT NOT NULL,
    partitions   BLOB NOT NULL,   -- msgpack list[PartitionIn]
    submitted_at REAL NOT NULL,
    state        TEXT NOT NULL,   -- queued | done | failed | cancelled
    finished_at  REAL,
    result       BLOB             -- msgpack JobReply once finished
);
"""

T = TypeVar("T")
_partitions_decoder = msgspec.msgpack.Decoder(list[PartitionIn])
_reply_decoder = msgspec.msgpack.Decoder(JobReply)
_encoder = msgspec.msgpack.Encoder()


class JournalEntry(msgspec.Struct, kw_only=True):
    """One journaled job (``result`` is set once the job has ended)."""

    job_id: str
    request_id: str
    circuit_id: str
    priority: int
    digest: str
    partitions: list[PartitionIn]
    submitted_at: float
    state: str = "queued"
    finished_at: float | None = None
    result: JobReply | None = None


class Journal:
    """The SQLite journal; open with :meth:`open`, close with :meth:`close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuzk-journal")

    @classmethod
    def open(cls, path: Path) -> Journal:
        """Open (creating if needed) the journal at ``path``; ConfigError if it is unusable."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise ConfigError(f"{path}: journal schema {row[0]}, this daemon writes "
                                  f"{SCHEMA_VERSION}; move the file away to start afresh")
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"{path}: cannot use the journal: {e}") from None
        return cls(path, conn)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _insert(self, e: JournalEntry) -> None:
        self._conn.execute(
            "INSERT INTO jobs (job_id, request_id, circuit_id, priority, digest, partitions,"
            " submitted_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'queued')",
            (e.job_id, e.request_id, e.circuit_id, e.priority, e.digest,
             _encoder.encode(e.partitions), e.submitted_at))

    def _finish(self, job_id: str, reply: JobReply) -> None:
        self._conn.execute(
            "UPDATE jobs SET state=?, finished_at=?, result=? WHERE job_id=?",
            (reply.state, reply.finished_at, _encoder.encode(reply), job_id))

    def _remove(self, job_ids: list[str]) -> None:
        self._conn.executemany("DELETE FROM jobs WHERE job_id=?", [(j,) for j in job_ids])

    async def add(self, entry: JournalEntry) -> None:
        """Write an accepted job; returns once it is on disk."""
        await self._run(self._insert, entry)

    async def finish(self, job_id: str, reply: JobReply) -> None:
        """Record a job's final state and reply."""
        await self._run(self._finish, job_id, reply)

    async def remove(self, job_ids: list[str]) -> None:
        """Delete jobs (pruned results, or a submit the engine refused)."""
        if job_ids:
            await self._run(self._remove, job_ids)

    def load(self) -> list[JournalEntry]:
        """Every journaled job, oldest first (called once at start-up, before serving)."""
        rows = self._conn.execute(
            "SELECT job_id, request_id, circuit_id, priority, digest, partitions, submitted_at,"
            " state, finished_at, result FROM jobs ORDER BY seq").fetchall()
        out = []
        for r in rows:
            out.append(JournalEntry(
                job_id=r[0], request_id=r[1], circuit_id=r[2], priority=r[3], digest=r[4],
                partitions=_partitions_decoder.decode(r[5]), submitted_at=r[6], state=r[7],
                finished_at=r[8], result=_reply_decoder.decode(r[9]) if r[9] else None))
        return out

    def close(self) -> None:
        """Finish pending writes and close the file (idempotent)."""
        self._pool.shutdown(wait=True)
        try:
            self._conn.close()
        except sqlite3.ProgrammingError:
            pass
