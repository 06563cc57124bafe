"""The job journal: every accepted job, durably, until its result is pruned.

This module owns one SQLite file (``[daemon] journal``, default ``<param_cache>/journal.sqlite``).
A job is written (and the transaction committed with ``synchronous=FULL``) *before* the submit is
acknowledged, so a job the client was told about survives a crash, a SIGKILL or a power cut. When
the job ends its row gets the final state and the reply a client would receive (msgpack of
:class:`~cuzk_mp.daemon.protocol.JobReply`), its partitions lose their input bytes (kinds and seeds
stay; the request's digest still finds a repeated request), and it stays until ``result_ttl`` has passed. At start-up
the daemon reads the rows back: finished ones answer AwaitProof again, unfinished ones (state
``queued``) are submitted to the engine again, in their original order.

The journal is the source of truth, so it is defended:

* **Damage refuses the start.** :meth:`Journal.open` raises :class:`JournalDamaged` (the daemon
  exits with a message naming the file and what to do) for a file that is not a database, one
  that fails SQLite's ``quick_check``, a write-ahead log whose committed frames SQLite would
  silently ignore (:mod:`.journal_wal`), and a journal that is missing or empty although this
  place held one: ``<journal>.id`` records the journal's identity the first time it is created,
  so a deleted, truncated or swapped journal is noticed instead of starting silently empty.
  Nothing is repaired or emptied automatically; the message says how to start afresh. A journal
  SQLite cannot open for another reason (a full disk, an I/O error) is not damage: a
  ResourceError (exit code 4, which systemd retries) that leaves the file as it was, naming the
  folder whose file system is full; a journal the failed start made is removed again (no empty
  journal is left for the next start to misread). The journal, its -wal, -shm, -journal and .id,
  and the daemon's lock file beside it, are regular files or absent: a FIFO, a folder or a device
  there (or a link at the -wal, -shm, -journal or lock file, none of which is followed) is a
  ConfigError naming it (:mod:`.journal_files`, at ``--check`` too), found without waiting on a
  FIFO or reading a device to its end.
* **A journal removed under the running daemon is written again.** SQLite would go on writing into
  the unlinked file, and every job it held would be gone at the next start (refused: the .id says a
  journal was there). Before each write, and when it closes, the journal checks that its path is
  still its file; where the path is gone (the file, or the whole folder: a cleaner of old files, an
  operator's ``rm``), the open database is copied there (SQLite's backup) with its .id, and written
  on from there; a journal path that is a link keeps it, the journal written again where it leads.
  A path that now holds another file is not overwritten: writes are refused (ResourceError) and the
  daemon's restart decides, as for any journal put in place.
* **A bad row is quarantined, the rest start.** :meth:`Journal.load` checks every row against
  the schema (types, priority 0..3, a state it knows, decodable partitions and result that
  agree with the row); a row that fails is moved, as it was, into the ``quarantine`` table with
  the reason, logged, and counted in :meth:`Journal.report` (the status document's ``journal``).
  A quarantined row that passes the checks (one an earlier release could not read) is moved back.

Versions: a daemon upgraded in place opens the journal of an earlier release with its jobs (schema
1 is migrated; later columns are added), and one rolled back to an earlier release of the same
schema number reads every job a later one wrote: rows are only ever given columns those releases
do not select, and a finished job's reply is stored in the form they decode
(:func:`~cuzk_mp.daemon.protocol.stored_reply`: its ``key_digest`` in a column of its own). A
journal of a larger schema number than this daemon's is refused at start (ConfigError).

All SQLite work runs on one dedicated thread (``cuzk-journal``), so the asyncio loop never
blocks on an fsync and writes keep their order; the async methods await that thread. It is a daemon
thread (:class:`~cuzk_mp.pipeline.serial.SerialThread`) and :meth:`Journal.close` waits for it only as long as it is
told: on a folder whose storage hangs an fsync never returns, and the daemon's stop must still end with
its process exiting. The status's quarantine figures are kept in memory (the table changes only as the
journal is loaded), so a status never waits behind a write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from cuzk_mp.daemon.journal_files import check_start_files, marker_path, owner_only, side_paths
from cuzk_mp.daemon.journal_wal import wal_damage
from cuzk_mp.daemon.notify import read_budget_s, starting
from cuzk_mp.daemon.protocol import MAX_ID_CHARS, JobReply, Partitions, reply_from_store, stored_reply
from cuzk_mp.daemon.threads import on_serial_thread
from cuzk_mp.errors import ConfigError, CuzkError, ResourceError
from cuzk_mp.formats.atomic import atomic_output, read_id_file
from cuzk_mp.pipeline.serial import SerialThread

log = logging.getLogger("cuzk_mp.daemon.journal")

# The schema's number changes only where a release that knows the previous one would misread the
# journal (it refuses a larger number). A column those releases never select is added without a new
# number, so a daemon rolled back to one of them still opens the journal: ``key_digest`` (the key a
# done job was proved with, kept beside its reply: protocol.stored_reply).
SCHEMA_VERSION = 2
WAL_ANNOUNCED_BYTES = 256 << 20  # a write-ahead log at least this large: its check is announced to systemd
# The columns every release of schema 2 selects, in order (the quarantine table has exactly these)
_COLUMNS = ("seq, job_id, request_id, circuit_id, priority, digest, partitions, submitted_at, state,"
            " finished_at, result, owner")
_ADDED_COLUMNS = {"key_digest": "TEXT"}  # added to schema 2 as described above, NULL in older rows
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
    result       BLOB,            -- msgpack JobReply once finished, without key_digest
    owner        TEXT NOT NULL DEFAULT '', -- the submitting client's identity ('' without tokens)
    key_digest   TEXT             -- the done job's JobReply.key_digest
);
"""
# Rows moved aside as they were (no types or constraints: whatever was in them), with the reason. Its
# columns stay those of _COLUMNS: a release before key_digest inserts rows into it by position. Their
# order is their rowid's (rows are only appended), never quarantined_at's: that is the wall clock,
# which a clock set back puts out of order.
_QUARANTINE = """
CREATE TABLE IF NOT EXISTS quarantine (
    seq, job_id, request_id, circuit_id, priority, digest, partitions, submitted_at, state,
    finished_at, result, owner, reason TEXT NOT NULL, quarantined_at REAL NOT NULL
);
"""
_MIGRATE_1_TO_2 = "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''"
QUARANTINE_IN_STATUS = 20
_MARKER_MAX = 256  # the most of a .id that is read: an id is 32 hex digits and a newline

# SQLite's primary result codes that mean the file itself is not a journal SQLite can read:
# SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_FORMAT. Others (SQLITE_FULL, SQLITE_IOERR, SQLITE_BUSY...) say
# nothing about the file's contents.
_DAMAGE_CODES = frozenset({11, 26, 24})
T = TypeVar("T")
_partitions_decoder = msgspec.msgpack.Decoder(Partitions)
_encoder = msgspec.msgpack.Encoder()


def _make_incremental(conn: sqlite3.Connection, path: Path) -> None:
    """Give a journal made without incremental vacuum (by an older daemon) that mode, once: SQLite
    changes an existing file's mode only through a full VACUUM, and without it the pages of pruned
    jobs never go back to the file system, so the file keeps its peak size for good. The VACUUM
    rewrites the file (time and free disk about its size); where it cannot run now (a full disk, a
    lock) the journal works as before and the next start tries again."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # INCREMENTAL
        return
    size = path.stat().st_size if path.exists() else 0
    log.info("[start] journal %s: one-time rewrite for incremental vacuum (%.1f MB)", path, size / 1e6)
    t0 = time.monotonic()
    try:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
    except sqlite3.Error as e:
        log.warning("[start] journal %s: the rewrite for incremental vacuum failed (%s); the journal works "
                    "as before, pruned jobs' pages stay in the file until a start where it succeeds", path, e)
        return
    log.info("[start] journal %s: rewritten in %.1f s (%.1f MB)", path, time.monotonic() - t0,
             path.stat().st_size / 1e6)


class JournalDamaged(CuzkError):
    """The journal file is missing, damaged or not a journal; the daemon refuses to start."""


class JournalEntry(msgspec.Struct, kw_only=True):
    """One journaled job (``result`` is set once the job has ended); the field constraints are
    what :meth:`Journal.load` checks every row against."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
    request_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
    circuit_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    priority: Annotated[int, msgspec.Meta(ge=0, le=3)]
    digest: str
    partitions: Partitions
    submitted_at: Annotated[float, msgspec.Meta(ge=0)]
    state: Literal["queued", "done", "failed", "cancelled"] = "queued"
    finished_at: Annotated[float, msgspec.Meta(ge=0)] | None = None
    result: JobReply | None = None
    owner: str = ""


def _entry_of(row: tuple[Any, ...]) -> JournalEntry:
    """Validate one row (columns as in ``_COLUMNS``, then key_digest); ValueError/msgspec errors say
    what is wrong."""
    _, job_id, request_id, circuit_id, priority, digest, partitions, submitted_at, state, \
        finished_at, result, owner, key_digest = row
    if not isinstance(partitions, bytes) or not (result is None or isinstance(result, bytes)):
        raise ValueError("partitions/result are not msgpack blobs")
    if not (key_digest is None or isinstance(key_digest, str)):
        raise ValueError("key_digest is not text")
    entry = msgspec.convert({
        "job_id": job_id, "request_id": request_id, "circuit_id": circuit_id, "priority": priority,
        "digest": digest, "partitions": _partitions_decoder.decode(partitions),
        "submitted_at": submitted_at, "state": state, "finished_at": finished_at,
        "result": reply_from_store(result, key_digest) if result is not None else None, "owner": owner,
    }, JournalEntry)
    if not entry.partitions:
        raise ValueError("a job without partitions")
    if (entry.state == "queued") != (entry.result is None):
        raise ValueError(f"state {entry.state!r} with{'' if entry.result else 'out'} a result")
    if entry.result is not None and (entry.result.job_id != entry.job_id
                                     or entry.result.state != entry.state
                                     or len(entry.result.partitions) != len(entry.partitions)):
        raise ValueError("the result belongs to another job, state or partition count")
    return entry


def _set_modes(conn: sqlite3.Connection) -> None:
    """The journal's modes on a connection: a write-ahead log, each commit on the disk before it returns."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")


def _file_identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) the path names now; None where it names nothing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _check_file(path: Path) -> str | None:
    """Before SQLite touches anything: the journal's files are regular files or absent
    (:func:`~cuzk_mp.daemon.journal_files.check_start_files`), the journal is present (if it ever
    was) and its WAL would not drop committed transactions. Returns the journal id the marker records."""
    check_start_files(path)
    marker = marker_path(path)
    recorded = read_id_file(marker, _MARKER_MAX)
    size = path.stat().st_size if path.exists() else None
    how_to = (f"; to start with an empty journal (losing its jobs), move {path}, its -wal and "
              f"-shm files and {marker} aside")
    if recorded and not size:
        state = "missing" if size is None else "empty (0 bytes)"
        raise JournalDamaged(f"{path}: the journal is {state}, but {marker} says a journal with "
                             f"id {recorded} was here: its accepted jobs and results are lost unless "
                             f"it is restored from a backup{how_to}")
    wal = side_paths(path)[0]
    if size is None and wal.exists():
        raise JournalDamaged(f"{path}: missing, but its write-ahead log {wal} exists{how_to}")
    with contextlib.suppress(OSError):
        wal_size = wal.stat().st_size
        if wal_size >= WAL_ANNOUNCED_BYTES:  # read whole, from a cold disk: seconds or minutes
            starting(f"checking the journal's write-ahead log {wal} ({wal_size / 2**30:.2f} GiB)",
                     read_budget_s(wal_size))
    problem = wal_damage(wal)
    if problem:
        raise JournalDamaged(f"{wal}: the journal's write-ahead log is damaged: {problem}; "
                             f"SQLite would silently drop those jobs (copy both files before any "
                             f"repair){how_to}")
    return recorded


class Journal:
    """The SQLite journal; open with :meth:`open`, close with :meth:`close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, journal_id: str) -> None:
        self.path = path
        self._conn = conn
        self._journal_id = journal_id
        self._file = _file_identity(path)  # what the path must still name (see _keep_in_place)
        self._pool = SerialThread("cuzk-journal")
        self._closed = False
        self.quarantined_now: list[dict[str, Any]] = []
        self._quarantine_report = self._report()  # the table changes only in load(): no read at status time

    @classmethod
    def open(cls, path: Path) -> Journal:
        """Open (creating if needed) the journal at ``path``: JournalDamaged if it is damaged or
        missing (see the module docstring), ConfigError for a schema from a newer version,
        ResourceError where SQLite cannot open it now (a full disk). A journal this call made (a first
        start) is removed again, with its .id and SQLite's files beside it, where the open fails: a
        start on a full disk leaves no empty journal that a later start would take for one that was
        there."""
        path.parent.mkdir(parents=True, exist_ok=True)
        recorded = _check_file(path)
        made = [p for p in (*side_paths(path), marker_path(path)) if not os.path.lexists(p)]
        if not path.exists():  # made 0600 (SQLite gives its -wal and -shm the same): it holds witnesses
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                made.insert(0, path)
        try:
            return cls._open_file(path, recorded)
        except BaseException:
            if made[:1] == [path]:  # nothing but what this call wrote is in them
                for p in made:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            raise

    @classmethod
    def _open_file(cls, path: Path, recorded: str | None) -> Journal:
        """:meth:`open` on the journal's file, there and checked: connected, prepared, its .id written."""
        owner_only(path)
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise JournalDamaged(f"{path}: cannot open the journal: {e}") from None
        try:
            journal_id = cls._prepare(conn, path, recorded)
        except BaseException:
            conn.close()
            raise
        try:
            if recorded is None:
                with atomic_output(marker_path(path), "w") as f:
                    f.write(journal_id + "\n")
            _make_incremental(conn, path)
        except BaseException:  # an interrupt during the rewrite: SQLite rolls it back; the file is unchanged
            conn.close()
            raise
        return cls(path, conn, journal_id)

    @staticmethod
    def _prepare(conn: sqlite3.Connection, path: Path, recorded: str | None) -> str:
        """Integrity check, schema (created or migrated) and identity; the journal's id."""
        try:
            check = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
            if check != ["ok"]:
                raise JournalDamaged(f"{path}: the journal fails SQLite's integrity check: "
                                     f"{'; '.join(map(str, check[:5]))}; move it aside (with its "
                                     f"-wal and .id files) to start with an empty journal")
            if not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:  # a new file: before its
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # tables (an existing one is never written here)
            _set_modes(conn)
            conn.execute("BEGIN IMMEDIATE")
            has_jobs = conn.execute("SELECT 1 FROM sqlite_master WHERE name='jobs'").fetchone()
            version = None
            if has_jobs:
                row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                version = int(row[0]) if row else None
                if version is None or version > SCHEMA_VERSION:
                    raise ConfigError(f"{path}: journal schema {version}, this daemon writes "
                                      f"{SCHEMA_VERSION}; move the file away to start afresh")
            for stmt in (_SCHEMA + _QUARANTINE).split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            if version == 1:
                conn.execute(_MIGRATE_1_TO_2)
                log.info("[start] journal %s: schema 1 -> 2 (job owners, quarantine)", path)
            have = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
            for column, decl in _ADDED_COLUMNS.items():
                if column not in have:  # a journal of an earlier release of schema 2
                    conn.execute(f"ALTER TABLE jobs ADD COLUMN {column} {decl}")
                    log.info("[start] journal %s: column %s added (the journal stays readable to the "
                             "releases before it)", path, column)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            row = conn.execute("SELECT value FROM meta WHERE key='journal_id'").fetchone()
            journal_id = row[0] if row else uuid.uuid4().hex
            if row is None:
                if recorded is not None and has_jobs:
                    raise JournalDamaged(f"{path}: this journal has no id but {marker_path(path)} "
                                         f"records {recorded}: not the journal that was here")
                conn.execute("INSERT INTO meta VALUES ('journal_id', ?)", (journal_id,))
            elif recorded is not None and recorded != journal_id:
                raise JournalDamaged(f"{path}: this is journal {journal_id}, but {marker_path(path)} "
                                     f"records {recorded}: another journal was put in its place; "
                                     "restore the right one, or move both aside to start afresh")
            conn.execute("COMMIT")
            return str(journal_id)
        except sqlite3.DatabaseError as e:
            code = getattr(e, "sqlite_errorcode", 0) & 0xFF
            if code not in _DAMAGE_CODES:
                # a full disk, an I/O error, a lock: nothing is wrong with the file, and moving it
                # aside would lose its jobs; the start can succeed once the cause is gone
                fix = (f"the file system of {Path(os.path.realpath(path)).parent} is full: free room there"
                       if code == sqlite3.SQLITE_FULL else "free the disk (or whatever the message names)")
                raise ResourceError(f"{path}: the journal cannot be opened now ({e}); it was not changed: "
                                    f"{fix} and start again") from None
            raise JournalDamaged(f"{path}: not a usable journal ({e}); move it aside (with its -wal "
                                 "and .id files) to start with an empty journal") from None
        finally:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    async def _run(self, fn: Callable[..., T], *args: Any, began: list[float] | None = None) -> T:
        """Run one write on the journal's thread, its path checked first (:meth:`_keep_in_place`); a
        write SQLite cannot make (a full disk or database, a read-only file) is a ResourceError naming
        the journal. ``began``: :func:`.threads.on_serial_thread`'s."""
        try:
            return await on_serial_thread(self._pool, self._in_place, fn, *args, began=began)
        except (sqlite3.Error, OSError) as e:
            raise ResourceError(f"the journal {self.path} cannot be written: {e}") from None

    def _in_place(self, fn: Callable[..., T], *args: Any) -> T:
        self._keep_in_place()
        return fn(*args)

    def _keep_in_place(self) -> None:
        """On the journal's thread: where the journal's path no longer names the open file (removed,
        or its folder), copy the open database there (SQLite's backup, into a temporary file renamed
        into place) with its .id, and go on with that file: the jobs stay where a restart reads them.
        ResourceError where the path now holds another file (not overwritten: see the module
        docstring). A path that is a link (or lies in a linked folder) is followed as far as it leads: the
        journal is written where the link leads, on the disk the operator chose, the link kept."""
        now = _file_identity(self.path)
        if now == self._file:
            return
        if now is not None:
            raise ResourceError(f"{self.path}: another file was put in the journal's place while the daemon runs; "
                                "nothing more is written (this daemon's jobs are in its open journal until it "
                                "stops): restart the daemon to use the journal now there")
        place = Path(os.path.realpath(self.path))  # the path itself where no link is on the way
        place.parent.mkdir(parents=True, exist_ok=True)
        tmp = place.with_name(f".{place.name}.{uuid.uuid4().hex[:8]}.restore")
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # it holds witnesses: owner only
        try:
            copy = sqlite3.connect(tmp)
            try:
                self._conn.backup(copy)
            finally:
                copy.close()
            self._conn.close()  # its last checkpoint goes into the unlinked file, and its -wal at the path
            os.replace(tmp, place)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        _set_modes(self._conn)
        with atomic_output(marker_path(self.path), "w") as f:
            f.write(self._journal_id + "\n")
        self._file = _file_identity(self.path)
        jobs = self._conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        where = "" if place == self.path else f" (at {place}, where its link leads)"
        log.error("journal %s was removed while the daemon ran: written again there%s from the open journal "
                  "(%d job(s)), with its .id; whatever removed it may do so again", self.path, where, jobs)

    def _insert(self, e: JournalEntry) -> None:
        self._conn.execute(
            "INSERT INTO jobs (job_id, request_id, circuit_id, priority, digest, partitions,"
            " submitted_at, state, owner) VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?)",
            (e.job_id, e.request_id, e.circuit_id, e.priority, e.digest,
             _encoder.encode(e.partitions), e.submitted_at, e.owner))

    def _finish(self, job_id: str, reply: JobReply, partitions: list[Any]) -> None:
        result, key_digest = stored_reply(reply)
        self._conn.execute(
            "UPDATE jobs SET state=?, finished_at=?, result=?, key_digest=?, partitions=? WHERE job_id=?",
            (reply.state, reply.finished_at, result, key_digest, _encoder.encode(partitions), job_id))

    def _remove(self, job_ids: list[str]) -> None:
        self._conn.executemany("DELETE FROM jobs WHERE job_id=?", [(j,) for j in job_ids])
        # the freed pages back to the file system: executescript steps the pragma to its end (execute: one page)
        self._conn.executescript("PRAGMA incremental_vacuum;")

    def busy_since(self) -> float | None:
        """When the write running on the journal's thread began (``time.monotonic()``); None while none runs."""
        return self._pool.running_since

    async def add(self, entry: JournalEntry, began: list[float] | None = None) -> None:
        """Write an accepted job; returns once it is on disk (``began``: when the write started, behind the
        writes before it)."""
        await self._run(self._insert, entry, began=began)

    async def finish(self, job_id: str, reply: JobReply, partitions: list[Any],
                     began: list[float] | None = None) -> None:
        """Record a job's final state and reply, and its partitions as a finished job keeps them
        (:func:`.job_records.without_inputs`: the input bytes are not kept once it has ended); ``began``:
        :meth:`add`'s."""
        await self._run(self._finish, job_id, reply, partitions, began=began)

    async def remove(self, job_ids: list[str]) -> None:
        """Delete jobs (pruned results, or a submit the engine refused)."""
        if job_ids:
            await self._run(self._remove, job_ids)

    def load(self) -> list[JournalEntry]:
        """Every valid journaled job, oldest first (called once at start-up, before serving).

        A row that fails the checks of :class:`JournalEntry` is quarantined (moved as it was
        into the ``quarantine`` table with the reason, and logged) and the others load. First, a
        quarantined row this release reads is moved back (:meth:`_unquarantine`).
        """
        self._unquarantine()
        out = []
        restore: list[tuple[bytes, str | None, Any]] = []
        for row in self._conn.execute(f"SELECT {_COLUMNS}, key_digest FROM jobs ORDER BY seq").fetchall():
            try:
                entry = _entry_of(row)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError,
                    RecursionError) as e:
                self._quarantine(row[0], row[1], f"{type(e).__name__}: {e}")
                continue
            out.append(entry)
            if entry.result is not None and entry.result.key_digest is not None and row[-1] is None:
                # stored with key_digest inside the reply, by a release before the column: stored apart,
                # so that an earlier release reads it (it would quarantine it)
                restore.append((*stored_reply(entry.result), row[0]))
        if restore:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany("UPDATE jobs SET result=?, key_digest=? WHERE seq=?", restore)
        self._quarantine_report = self._report()
        return out

    def _unquarantine(self) -> None:
        """Move back into the journal each quarantined row that passes this release's checks and
        whose job id is not in use again: an earlier release (a daemon rolled back) quarantined the
        rows a later one wrote with a field it did not know, such as the done jobs whose stored reply
        carried ``key_digest``. Each comes back with its original place in the order, its reply
        stored as every release reads it (:func:`~cuzk_mp.daemon.protocol.stored_reply`)."""
        rows = self._conn.execute(
            f"SELECT rowid, {_COLUMNS} FROM quarantine WHERE job_id NOT IN (SELECT job_id FROM jobs) "
            "ORDER BY rowid").fetchall()
        for rowid, *row in rows:
            try:
                entry = _entry_of((*row, None))
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, RecursionError):
                continue  # still unreadable: it stays where it is
            result, key_digest = stored_reply(entry.result) if entry.result is not None else (None, None)
            try:
                with self._conn:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._conn.execute(
                        f"INSERT INTO jobs ({_COLUMNS}, key_digest) SELECT {_COLUMNS.replace('result', '?')}, ? "
                        "FROM quarantine WHERE rowid=?", (result, key_digest, rowid))
                    self._conn.execute("DELETE FROM quarantine WHERE rowid=?", (rowid,))
            except sqlite3.Error as e:  # its place taken (a seq in use), or not an integer: it stays
                log.warning("[start] journal %s: job %s in the quarantine table is readable but could not be "
                            "moved back: %s", self.path, entry.job_id, e)
                continue
            log.warning("[start] journal %s: job %s (%s), quarantined by a release that could not read it, "
                        "is readable and was moved back", self.path, entry.job_id, entry.state)

    def _quarantine(self, seq: Any, job_id: Any, reason: str) -> None:
        now = time.time()
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(f"INSERT INTO quarantine SELECT {_COLUMNS}, ?, ? FROM jobs WHERE seq=?",
                               (reason, now, seq))
            self._conn.execute("DELETE FROM jobs WHERE seq=?", (seq,))
        shown = job_id if isinstance(job_id, str) else repr(job_id)
        self.quarantined_now.append({"job_id": shown, "reason": reason, "quarantined_at": now})
        log.error("[start] journal %s: job %s is unreadable and was quarantined (moved into the "
                  "quarantine table): %s", self.path, shown, reason)

    async def report(self) -> dict[str, Any]:
        """The journal's health for the status document: quarantined rows (all time: count; the
        latest few with their reasons) and those quarantined at this start; ``closed`` once
        the daemon has closed the journal (a status asked for during the very end of a drain)."""
        if self._closed:
            return {"closed": True}
        return dict(self._quarantine_report)

    def _report(self) -> dict[str, Any]:
        total = self._conn.execute("SELECT count(*) FROM quarantine").fetchone()[0]
        latest = self._conn.execute(
            "SELECT job_id, reason, quarantined_at FROM quarantine ORDER BY rowid DESC "
            "LIMIT ?", (QUARANTINE_IN_STATUS,)).fetchall()
        return {"quarantined": int(total), "quarantined_at_start": len(self.quarantined_now),
                "quarantine": [{"job_id": j if isinstance(j, str) else repr(j), "reason": r,
                                "quarantined_at": t} for j, r, t in latest]}

    def close(self, wait_s: float | None = None) -> bool:
        """Finish pending writes and close the file (idempotent); a journal removed meanwhile is
        written again first (:meth:`_keep_in_place`), so the jobs it holds are there at the next start.
        All of it on the journal's thread, waited for ``wait_s`` at most (None: no limit): on a folder
        whose storage hangs a write or the close never ends, and the daemon's stop must not wait for it
        (its thread keeps no process from exiting; what SQLite committed is on disk, and a job whose end
        is not is run again after a restart). Whether it ended."""
        if self._closed:
            return True
        self._closed = True
        self._pool.call_soon(self._close_file)
        if self._pool.close(wait_s):
            return True
        log.error("journal %s: its writes and its close did not end within %g s (the journal's storage does "
                  "not answer?); the daemon stops without them: jobs whose end they were writing run again "
                  "after a restart", self.path, wait_s)
        return False

    def _close_file(self) -> None:
        try:
            self._keep_in_place()
        except (CuzkError, sqlite3.Error, OSError) as e:
            log.error("journal %s: %s", self.path, e)
        try:
            self._conn.close()
        except sqlite3.ProgrammingError:
            pass
