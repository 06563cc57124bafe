"""The fleet's database access: transactions, the queue library's query objects, read-only views.

This module owns how a box talks to the shared database: the connection pool, one transaction
per operation (:meth:`FleetStore._tx`, which turns database errors into ResourceError, or
InputError for a value the database refuses), the queue library's ``Queries`` over each
transaction's connection (its tables prefixed ``cuzk_``), the ``finished``/``requeued``
notifications of :data:`~.schema.EVENTS_CHANNEL`, and everything that only reads or trims the
shared state: a job's status, the boxes, the queue depths, pruning. What changes claims lives in
:mod:`.queue` (:class:`~.queue.Fleet` is a FleetStore).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
from pgqueuer.adapters.persistence import qb
from pgqueuer.adapters.persistence.queries import Queries
from pgqueuer.domain.settings import DBSettings
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from cuzk_mp.daemon.fleet import schema
from cuzk_mp.daemon.fleet.config import FleetConfig, redact_dsn
from cuzk_mp.daemon.fleet.inputs import (LEFTOVER_ASIDE_S, put_back, remove_leftover_asides, remove_stale_inputs,
                                         set_aside_stale, stale_cutoff, stale_inputs, stored_digest)
from cuzk_mp.daemon.fleet.keys import KeyDecision
from cuzk_mp.daemon.fleet.models import BoxInfo, JobStatus, QueueDepth, circuit_of
from cuzk_mp.daemon.fleet.waits import on_share
from cuzk_mp.errors import ConfigError, InputError, ResourceError
from cuzk_mp.pipeline.types import Priority

JOB_COLUMNS = ("job_id, request_id, circuit_id, state, priority, n_partitions, inputs_ref, "
               "inputs_sha256, submitted_by, client, box, claims, attempts, "
               "extract(epoch FROM submitted_at) AS submitted_at, "
               "extract(epoch FROM started_at) AS started_at, "
               "extract(epoch FROM finished_at) AS finished_at, result, key_digest, error, error_kind, failed_on")

POOL_MAX = 4
RETRYING_SHOWN = 50  # the most jobs `fleet status` lists as retried after failing on a box


def connect_kwargs(cfg: FleetConfig) -> dict[str, Any]:
    """What every connection of a box is opened with (its pool's, its first one and its LISTEN one).

    A link to the database may die without a word (a switch fails, the database host loses power and
    comes back knowing nothing of its connections): a statement sent over it waited for TCP to give
    up (15 minutes) rather than fail within the connect timeout, and the LISTEN connection, which
    never sends, stayed open for ever, deaf (every waiter then heard of its job only at its 60 s
    safety-net read). ``tcp_user_timeout`` ends a connection whose data goes unacknowledged for the
    connect timeout, and keepalive probes after that long idle find a dead one that sends nothing.

    The server's end of each connection is set up alike, by the session settings of
    :func:`session_options`: a box that died or froze in the middle of a transaction otherwise left
    the server holding that transaction's locks (a claimed job's rows, the box's row) until it
    noticed, and with the operating system's defaults it notices a silent peer after 2 hours and 11
    minutes; until then no box could settle or take over that job.
    """
    timeout_s = max(1, math.ceil(cfg.connect_timeout_s))
    idle_s, interval_s, count = timeout_s, max(1, math.ceil(timeout_s / 3)), 3
    return {"autocommit": True, "application_name": f"cuzk-fleet {cfg.box}", "connect_timeout": timeout_s,
            "keepalives": 1, "keepalives_idle": idle_s, "keepalives_interval": interval_s,
            "keepalives_count": count, "tcp_user_timeout": timeout_s * 1000,
            "options": session_options(cfg, {
                "tcp_keepalives_idle": idle_s, "tcp_keepalives_interval": interval_s, "tcp_keepalives_count": count,
                "tcp_user_timeout": timeout_s * 1000,
                "idle_in_transaction_session_timeout": math.ceil(cfg.stall_timeout_s * 1000)})}


def session_options(cfg: FleetConfig, settings: dict[str, int]) -> str:
    """The ``options`` a box's connections start their server sessions with (libpq's ``-c name=value``
    each): ``settings``, then the options of the dsn (or of ``PGOPTIONS`` where it names none), which
    win where they set the same name (an operator's escape hatch; none is needed).

    * ``tcp_keepalives_*`` and ``tcp_user_timeout``: the server gives up on a silent box's connection
      after as long as the box gives up on the server (:func:`connect_kwargs`): the peer of a connection
      idle for the connect timeout is probed, and the connection ends once nothing was heard from the
      peer for the connect timeout with a probe out (about 15 s at the default 10 s), or once data it
      sent goes unacknowledged that long. Its session ends, its transaction is rolled back and its
      locks are freed. That includes the LISTEN session of a frozen box, which sends notifications
      until the box's socket buffers are full, then waits on the send for as long as the box's kernel
      acknowledges the zero-window probes, holding back the database's notification queue.
    * ``idle_in_transaction_session_timeout`` = the stall timeout: a box that stops between two
      statements of a transaction (frozen by SIGSTOP or a debugger, its event loop blocked, or just
      silent) still answers keepalives from its kernel, so only this ends its transaction. Inside one a
      box waits on nothing but the database and, under an inputs' lock, one file's rename or mtime
      refresh (the long write of a submit's inputs happens before it,
      :meth:`.submits.FleetSubmits.submit`, and a prune's unlink after it,
      :meth:`FleetStore.prune_inputs`, which puts back a file whose rename ended after the timeout),
      so only a box that stalled reaches it, and a box that stalled that long has lost its claims
      anyway (other boxes take them over after the stall timeout, once these locks are freed). The
      timeout counts only the time between statements: a long statement (a large result written) is
      not cut short.

    An ordinary role may set each of these (they are user settings); where the server runs on a
    Unix socket the keepalive settings are ignored, as a socket has no peer to lose.
    """
    own = " ".join(f"-c {name}={value}" for name, value in settings.items())
    given = conninfo_to_dict(cfg.dsn).get("options") or os.environ.get("PGOPTIONS", "")
    return f"{own} {given}".strip()


# What a server answers when it refuses a connection's role, password or database (libpq's texts,
# in the server's default English): nothing a restart changes, so a bad [fleet] dsn, not an outage.
REFUSALS = ("authentication failed", "does not exist", "no pg_hba.conf entry", "no password supplied",
            "permission denied")


async def first_connection(cfg: FleetConfig) -> psycopg.AsyncConnection[Any]:
    """One plain connection, opened before anything else of a box: a database that refuses this
    box's credentials or database name is a ConfigError (exit 2: the dsn must change), one that
    cannot be reached a ResourceError (exit 4: it may come back); both with the server's reason."""
    try:
        return await psycopg.AsyncConnection.connect(cfg.dsn, **connect_kwargs(cfg))
    except psycopg.Error as e:
        raise start_error(cfg, e, "the connection", "connect to") from None


async def check_joinable(cfg: FleetConfig) -> None:
    """What a daemon checks right after its instance lock, before the engine's long start: the dsn
    connects (:func:`first_connection`), and where the box's join would create or upgrade the fleet's
    tables (the database records an older ``schema_version``), its role may: a server that takes only
    read-only transactions is a ResourceError (a standby may be promoted), a role without CREATE on its
    schema, or not owning the tables to upgrade, a ConfigError naming ``fleet.dsn`` (only a grant or
    another role helps). Without it the join failed so only after minutes of engine start."""
    conn = await first_connection(cfg)
    try:
        async with conn:
            if await schema.recorded_version(conn) >= schema.SCHEMA_VERSION:
                return
            cur = await conn.execute(
                "SELECT current_setting('transaction_read_only') = 'on', current_user, current_schema(), "
                "COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false), "
                "COALESCE((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class "
                "WHERE oid = to_regclass('cuzk_fleet_jobs')), true)")
            row = await cur.fetchone()
    except psycopg.Error as e:
        raise start_error(cfg, e, "the check of its role", "check the role of") from None
    assert row is not None
    read_only, role, where, may_create, owns = row
    if read_only:
        raise ResourceError(f"fleet: cannot create or upgrade the fleet's tables in {redact_dsn(cfg.dsn)}: it takes "
                            "only read-only transactions (a hot standby, or default_transaction_read_only)")
    if not may_create or not owns:
        what = f"CREATE on schema {where}" if not may_create else "ownership of the fleet's tables"
        raise ConfigError(f"fleet.dsn: the database at {redact_dsn(cfg.dsn)} refused creating or upgrading the "
                          f"fleet's tables: permission denied (role {role} lacks {what}; the first box to join, or "
                          "the first of a new release, needs it)")


def start_error(cfg: FleetConfig, e: psycopg.Error, refused: str, cannot: str) -> ConfigError | ResourceError:
    """What a box's start makes of a database error after which it cannot join (``refused``: what
    the server refused, ``cannot``: what the box could not do): a refusal of its role, password or
    database (:data:`REFUSALS`) is a ConfigError naming ``fleet.dsn``, anything else a ResourceError,
    both with the server's reason. The first connection may succeed and a later step of the start
    still fail (a read-only role cannot create the tables, a role's connection limit leaves no room
    for the LISTEN connection): a driver's exception escaping there was a traceback and an exit of
    70 ("a bug") instead of the exit code of a database that refused or did not answer."""
    reason = " ".join(str(e).split())
    if any(r in reason for r in REFUSALS):
        return ConfigError(f"fleet.dsn: the database at {redact_dsn(cfg.dsn)} refused {refused}: {reason}")
    return ResourceError(f"fleet: cannot {cannot} {redact_dsn(cfg.dsn)}: {reason}")


def new_pool(cfg: FleetConfig) -> AsyncConnectionPool:
    """A box's connection pool, not yet open. An idle connection is tested before it is lent
    (``check``): after a database restart every idle one is dead, and the first caller would get
    that error rather than a fresh connection."""
    return AsyncConnectionPool(cfg.dsn, min_size=1, max_size=POOL_MAX, open=False, kwargs=connect_kwargs(cfg),
                               timeout=cfg.connect_timeout_s, name=f"cuzk-fleet-{cfg.box}",
                               check=AsyncConnectionPool.check_connection)


SHARE_KEY = "inputs_share"  # cuzk_fleet_meta's key of the shared inputs folder's id

# The job a client's id names: a job id, else the job of that request_id.
RESOLVE_ID = ("COALESCE((SELECT job_id FROM cuzk_fleet_jobs WHERE job_id = %(id)s), "
              "(SELECT job_id FROM cuzk_fleet_requests WHERE request_id = %(id)s))")


class FleetStore:
    """Database access shared by every operation of a box (see the module docstring)."""

    def __init__(self, cfg: FleetConfig, pool: AsyncConnectionPool) -> None:
        self.cfg = cfg
        self._pool = pool
        self._settings = DBSettings(prefix=schema.QUEUE_PREFIX)
        self._qbe = qb.QueryBuilderEnvironment(settings=self._settings)
        self._qbq = qb.QueryQueueBuilder(settings=self._settings)
        self._qbs = qb.QuerySchedulerBuilder(settings=self._settings)
        self._queue_table = sql.Identifier(*self._settings.qualified.queue_table.split("."))
        self._renewed = asyncio.Event()  # set when renew_pool replaces the pool
        self._closed = False
        self.instance = uuid.uuid4()  # this process's claims and box row carry it
        self.loading: tuple[str, ...] = ()  # keys this box is loading, written with its row (plan_load)
        self.load_limit_s: float | None = None  # for how long that load holds its keys (keys.load_limit_s)

    def _queries(self, conn: psycopg.AsyncConnection) -> Queries:
        return Queries(PsycopgDriver(conn), qbe=self._qbe, qbq=self._qbq, qbs=self._qbs)

    async def renew_pool(self) -> None:
        """Replace the pool by a fresh one, once the database answers again after an outage (the
        LISTEN link is back): the old pool retries its lost connections with a doubling delay
        (1, 2, 4 ... s), so after a long outage it would go on failing for as long again."""
        if self._closed:
            return
        old, self._pool = self._pool, new_pool(self.cfg)
        renewed, self._renewed = self._renewed, asyncio.Event()
        await self._pool.open(wait=False)
        renewed.set()  # callers still waiting on the old pool move to this one (see _connection)
        with contextlib.suppress(Exception):  # its connections are dead; nothing to wait for
            await asyncio.wait_for(old.close(timeout=1.0), 5.0)

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[tuple[psycopg.AsyncConnection, Queries]]:
        """One transaction on a pooled connection; database errors become ResourceError (InputError
        for a value the database refuses)."""
        if self._closed and self._pool.closed:
            raise ResourceError(f"fleet: box {self.cfg.box} is closed")
        try:
            async with self._connection() as conn, conn.transaction():
                yield conn, self._queries(conn)
        except psycopg.DataError as e:
            raise InputError(f"fleet: the database refused a value: {e}") from None
        except (psycopg.Error, PoolTimeout) as e:
            raise ResourceError(f"fleet: database {redact_dsn(self.cfg.dsn)}: {type(e).__name__}: {e}") from None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection of the pool, given back after the block.

        A caller that waits on a pool that :meth:`renew_pool` replaces meanwhile moves on to the
        new pool. The old pool, closed, fails the callers waiting in its queue at that moment,
        but not one that was between two checks of its dead connections (the pool's ``check``
        backs off between them): that caller queued again on the closed pool, which serves no
        one, and failed only after the whole connect timeout, long after the database was back.
        """
        while True:
            pool, renewed = self._pool, self._renewed
            getting = asyncio.ensure_future(pool.getconn())
            swapped = asyncio.ensure_future(renewed.wait())
            try:
                await asyncio.wait({getting, swapped}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                await _abandon(pool, getting)
                raise
            finally:
                swapped.cancel()
            if not getting.done():  # the pool was renewed while this caller waited on it
                await _abandon(pool, getting)
                continue
            try:
                conn = getting.result()
            except (PoolClosed, PoolTimeout):
                if pool is self._pool:
                    raise
                continue  # the old pool gave up on this caller as it was renewed
            break
        try:
            async with conn:
                yield conn
        finally:
            await pool.putconn(conn)

    async def share_id(self, proposed: str | None = None) -> str | None:
        """The id of the fleet's shared inputs folder (``cuzk_fleet_meta.inputs_share``, the id its
        marker holds, :func:`.inputs.share_problem`); with ``proposed``, that id is recorded if none is
        yet (the caller wrote it into the marker first) and the id recorded is returned either way.
        A row, not a column: boxes of earlier releases neither read nor need it."""
        async with self._tx() as (conn, _):
            if proposed is not None:
                await conn.execute("INSERT INTO cuzk_fleet_meta (key, value) VALUES (%s, %s) "
                                   "ON CONFLICT (key) DO NOTHING", (SHARE_KEY, proposed))
            cur = await conn.execute("SELECT value FROM cuzk_fleet_meta WHERE key = %s", (SHARE_KEY,))
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def status(self, job_id: str, client: str | None = None) -> JobStatus:
        """The job as the shared tables record it (InputError if unknown or pruned).

        ``job_id`` may also be the request_id the job was submitted with (a single daemon names a
        job by its request_id, so clients written for one keep working against a fleet). With
        ``client`` (None: any), another client's job is unknown too, exactly like one that never
        existed.
        """
        async with self._tx() as (conn, _):
            cur = await conn.cursor(row_factory=dict_row).execute(
                f"SELECT {JOB_COLUMNS} FROM cuzk_fleet_jobs WHERE job_id = {RESOLVE_ID}", {"id": job_id})
            row = await cur.fetchone()
        if row is None or (client is not None and row["client"] != client):
            raise InputError(f"job_id: unknown job {job_id!r} (never submitted, or pruned after it ended)")
        return status_of(row)

    async def retrying(self, limit: int = RETRYING_SHOWN) -> list[JobStatus]:
        """Unfinished jobs that failed on a box (or whose box stopped renewing the claim), the longest
        waiting first, at most ``limit``: where their attempts went (``failed_on``) and their last error."""
        async with self._tx() as (conn, _):
            cur = await conn.cursor(row_factory=dict_row).execute(
                f"SELECT {JOB_COLUMNS} FROM cuzk_fleet_jobs WHERE state IN ('queued', 'running') "
                "AND cardinality(failed_on) > 0 ORDER BY submitted_at, job_id LIMIT %s", (limit,))
            rows = await cur.fetchall()
        return [status_of(r) for r in rows]

    async def boxes(self) -> list[BoxInfo]:
        """Every box that has joined: its state, resident keys, free slots and running jobs.

        A box is ``stale`` once its last heartbeat is older than its own stall timeout, as its row
        records it: boxes of one fleet may run different ones, and a box renewing every 20 s under a
        60 s timeout was listed stale by a reader whose own timeout is 15 s (and its keys counted for
        no holder in that reader's key-loading decision), while one that renews every second and died
        10 s ago was listed up by a reader with a 30 s timeout. A row of a release before schema 4
        records 0: it is judged by the reader's own stall timeout, as those releases judged every box."""
        async with self._tx() as (conn, _):
            return await self._boxes(conn)

    async def _boxes(self, conn: psycopg.AsyncConnection) -> list[BoxInfo]:
        cur = await conn.cursor(row_factory=dict_row).execute(
            "SELECT b.box, b.host, b.pid, b.resident, b.loading, b.free_slots, b.paused, "
            "b.left_at IS NOT NULL AS left, extract(epoch FROM b.started_at) AS started_at, "
            "extract(epoch FROM now() - b.last_heartbeat) AS age, "
            "CASE WHEN b.stall_timeout_s > 0 THEN b.stall_timeout_s ELSE %s END AS stall_s, "
            "extract(epoch FROM now() - b.loading_since) AS loading_s, b.load_limit_s, "
            "(SELECT count(*) FROM cuzk_fleet_jobs j WHERE j.state = 'running' AND j.box = b.box "
            " AND j.owner = b.instance) AS running FROM cuzk_fleet_boxes b ORDER BY b.box",
            (self.cfg.stall_timeout_s,))
        rows = await cur.fetchall()
        return [BoxInfo(box=r["box"], state="left" if r["left"] else
                        "stale" if float(r["age"]) > float(r["stall_s"]) else "up",
                        host=r["host"], pid=r["pid"], resident=tuple(r["resident"]), free_slots=r["free_slots"],
                        running=int(r["running"]), started_at=float(r["started_at"]),
                        heartbeat_age_s=float(r["age"]), paused=r["paused"], loading=tuple(r["loading"]),
                        loading_s=None if not r["loading"] or r["loading_s"] is None else float(r["loading_s"]),
                        load_limit_s=None if not r["loading"] else r["load_limit_s"])
                for r in rows]

    async def queue_depths(self) -> list[QueueDepth]:
        """Per circuit and priority: queued, running, and running on a box that stalled.

        A job is stalled once its claim has lapsed in the fleet: not renewed for the longest stall
        timeout of the live boxes (:meth:`_longest_stall_s`), when a box takes it over. By the reader's
        own timeout, a reader with a shorter one than the box running the job counted it stalled while
        that box renewed it, and its key-loading decision loaded a key for a backlog that was not one."""
        async with self._tx() as (conn, queries):
            return await self._queue_depths(conn, queries)

    async def _longest_stall_s(self, conn: psycopg.AsyncConnection) -> float:
        """When a claim lapses: after the longest ``stall_timeout`` of the boxes in the fleet that are up by
        their own (the reader's own included; :meth:`.queue.Fleet._read_lapse` says why)."""
        cur = await conn.execute("SELECT max(stall_timeout_s) FROM cuzk_fleet_boxes WHERE left_at IS NULL "
                                 "AND last_heartbeat >= now() - make_interval(secs => stall_timeout_s)")
        row = await cur.fetchone()
        return max(self.cfg.stall_timeout_s, float(row[0] or 0.0) if row is not None else 0.0)

    async def _queue_depths(self, conn: psycopg.AsyncConnection, queries: Queries) -> list[QueueDepth]:
        sizes = await queries.queue_size()
        stale = await queries.stale_jobs(timedelta(seconds=await self._longest_stall_s(conn)), limit=100_000)
        counts: dict[tuple[str, int], list[int]] = {}
        for s in sizes:
            cid = circuit_of(s.entrypoint)
            if cid is not None and s.status in ("queued", "picked"):
                counts.setdefault((cid, s.priority), [0, 0, 0])[0 if s.status == "queued" else 1] += s.count
        for j in stale:
            cid = circuit_of(j.entrypoint)
            if cid is not None:
                c = counts.setdefault((cid, j.priority), [0, 0, 0])
                c[1], c[2] = max(c[1] - 1, 0), c[2] + 1
        return [QueueDepth(cid, Priority(-p), *c) for (cid, p), c in sorted(counts.items(), key=lambda kv: (
            kv[0][0], -kv[0][1]))]

    async def plan_load(self, decide: Callable[[Sequence[QueueDepth], Sequence[BoxInfo]], KeyDecision],
                        limit_s: Callable[[str], float]) -> KeyDecision:
        """``decide`` (:func:`.keys.plan_key_load` over this box's keys) on the queue depths and boxes, and
        where it loads a key, the key written into this box's row as loading, from now (the database's
        clock) for ``limit_s(key)`` seconds (:func:`.keys.load_limit_s`), all under the fleet's
        key-loading lock (:data:`~.schema.KEY_LOAD_LOCK_KEY`): the idle boxes that one submit wakes decide
        at the same moment, and each read the others' rows before any load began. End with
        :meth:`end_load`.

        Where another box holds the lock, this one decides nothing now (its next idle check asks again):
        a box frozen inside its decision holds the lock until the server ends its session, and a claim
        loop waiting on it claimed nothing meanwhile."""
        try:
            async with self._tx() as (conn, queries):
                cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (schema.KEY_LOAD_LOCK_KEY,))
                if not (row := await cur.fetchone()) or not row[0]:
                    return KeyDecision(None, (), "another box is deciding which key to load; again later")
                decision = decide(await self._queue_depths(conn, queries), await self._boxes(conn))
                if decision.load is not None:  # set before the row's write: a heartbeat meanwhile keeps it
                    self.loading, self.load_limit_s = (decision.load,), limit_s(decision.load)
                    await conn.execute("UPDATE cuzk_fleet_boxes SET loading = %s, loading_since = now(), "
                                       "load_limit_s = %s WHERE box = %s AND instance = %s",
                                       (list(self.loading), self.load_limit_s, self.cfg.box, self.instance))
        except BaseException:
            self.loading, self.load_limit_s = (), None
            raise
        return decision

    async def end_load(self, resident: Sequence[str]) -> None:
        """The load :meth:`plan_load` began ended (or failed): this box's row shows ``resident`` (the keys
        it holds now) and no load. Where the database does not answer, the next heartbeat writes both."""
        self.loading, self.load_limit_s = (), None
        async with self._tx() as (conn, _):
            await conn.execute("UPDATE cuzk_fleet_boxes SET loading = '{}', loading_since = NULL, load_limit_s = NULL, "
                               "resident = %s WHERE box = %s AND instance = %s",
                               (list(resident), self.cfg.box, self.instance))

    async def prune(self, older_than_s: float) -> int:
        """Delete what ended more than ``older_than_s`` ago; the number of jobs deleted.

        Jobs go with their request ids (a later submit with the same request_id makes a new
        job), boxes that left go too, and the queue library's per-transition log rows are first
        folded into its statistics table (its own ``aggregate_logs``), then deleted: the library
        keeps no retention of its own and the log grows by several rows per job.

        A box that never left (SIGKILLed, powered off) goes once its last heartbeat is older than
        ``older_than_s``, this box's stall timeout and the box's own (its row's), whichever is longest,
        and no job is running under its claim: it would otherwise be listed ``stale`` for ever. A box
        that still holds a claim stays listed, since it explains a job no live box has taken over yet;
        one that was merely hung registers again at its next heartbeat (:meth:`.queue.Fleet.heartbeat`).
        """
        async with self._tx() as (conn, queries):
            cur = await conn.execute("DELETE FROM cuzk_fleet_jobs WHERE finished_at < now() - "
                                     "make_interval(secs => %s)", (older_than_s,))
            n = cur.rowcount
            await conn.execute("DELETE FROM cuzk_fleet_boxes WHERE left_at < now() - make_interval(secs => %s)",
                               (older_than_s,))
            await conn.execute(
                "DELETE FROM cuzk_fleet_boxes b WHERE b.left_at IS NULL "
                "AND b.last_heartbeat < now() - make_interval(secs => GREATEST(%s, b.stall_timeout_s)) "
                "AND NOT EXISTS (SELECT 1 FROM "
                "cuzk_fleet_jobs j WHERE j.state = 'running' AND j.box = b.box AND j.owner = b.instance)",
                (max(older_than_s, self.cfg.stall_timeout_s),))
            await queries.aggregate_logs()
            await conn.execute(sql.SQL("DELETE FROM {} WHERE aggregated AND created < now() - "
                                       "make_interval(secs => %s)").format(
                sql.Identifier(*self._settings.qualified.queue_table_log.split("."))), (older_than_s,))
        return n

    async def prune_inputs(self, directory: Path, older_than_s: float) -> int:
        """Remove the stored inputs in ``directory`` that no job (of any state, not yet pruned) needs (none
        of their sha256, whatever path its reference spells) and nobody stored again for ``older_than_s``
        seconds (on the folder's clock, :func:`~.inputs.stale_cutoff`), and the partial files of stores that never
        ended; how many went. Each file is checked and removed under its inputs' lock, which a submit
        holds from storing the same bytes to its job's commit (:meth:`.submits.FleetSubmits.submit`):
        a file is never removed under a job being queued with it, even where the shared folder shows
        an old mtime for a file just stored again (an NFS attribute cache).

        Under the lock the file only leaves its name (one rename aside); it is unlinked after the
        commit. A rename that hung (a hard mount whose server went quiet) for longer than the stall
        timeout may end after the server ended the transaction, idle that long, and freed the lock,
        and so after a submit of the same bytes queued its job with the file: where the transaction
        fails, the file is put back (the next round decides again). The name it was set aside under is
        this box's and this attempt's, which no other box's prune takes (:func:`~.inputs.set_aside_stale`);
        those a box killed in between left behind go after :data:`~.inputs.LEFTOVER_ASIDE_S`."""
        cutoff = await on_share(stale_cutoff, directory, older_than_s)
        stale = await on_share(stale_inputs, directory, cutoff)
        removed = await on_share(remove_leftover_asides, directory,
                                          cutoff + older_than_s - max(older_than_s, LEFTOVER_ASIDE_S))
        for path in stale:
            digest = stored_digest(path)
            if digest is None:  # a store that never ended: no job names it
                removed += await on_share(remove_stale_inputs, [path], cutoff)
                continue
            aside: Path | None = None
            try:
                async with self._tx() as (conn, _):
                    await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", schema.inputs_lock(digest))
                    # by the bytes, not the path: a reference may spell the folder otherwise (through the
                    # target of a symlink on the way to it), and a file its job still needs went with it
                    cur = await conn.execute("SELECT 1 FROM cuzk_fleet_jobs WHERE inputs_sha256 = %s LIMIT 1",
                                             (digest,))
                    if await cur.fetchone() is None:
                        aside = await on_share(set_aside_stale, path, cutoff, self.cfg.box)
            except BaseException:
                if aside is not None:  # the lock may have gone with the session before the rename ended
                    await on_share(put_back, aside, path)
                raise
            if aside is not None:
                await on_share(functools.partial(aside.unlink, missing_ok=True))
                removed += 1
        return removed


async def _abandon(pool: AsyncConnectionPool, getting: asyncio.Future[Any]) -> None:
    """Stop waiting for a pool's connection; one handed over meanwhile goes back to the pool."""
    getting.cancel()
    try:
        conn = await getting
    except (Exception, asyncio.CancelledError):
        return
    await pool.putconn(conn)


async def notify(conn: psycopg.AsyncConnection, event: dict[str, str]) -> None:
    """Send a fleet event; it is delivered when the surrounding transaction commits."""
    await conn.execute("SELECT pg_notify(%s, %s)", (schema.EVENTS_CHANNEL, json.dumps(event)))


def status_of(row: dict[str, Any]) -> JobStatus:
    """A JobStatus from a ``SELECT JOB_COLUMNS`` row."""
    def ts(v: Any) -> float | None:
        return None if v is None else float(v)
    return JobStatus(job_id=row["job_id"], request_id=row["request_id"], circuit_id=row["circuit_id"],
                     state=row["state"], priority=Priority(row["priority"]), n_partitions=row["n_partitions"],
                     inputs_ref=row["inputs_ref"], inputs_sha256=row["inputs_sha256"],
                     submitted_by=row["submitted_by"], client=row["client"], box=row["box"],
                     claims=row["claims"], attempts=row["attempts"], submitted_at=float(row["submitted_at"]),
                     started_at=ts(row["started_at"]), finished_at=ts(row["finished_at"]),
                     result=None if row["result"] is None else bytes(row["result"]), error=row["error"],
                     error_kind=row["error_kind"], key_digest=row["key_digest"], failed_on=tuple(row["failed_on"]))
