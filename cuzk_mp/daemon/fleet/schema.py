"""The fleet's tables in the shared database, and the idempotent migration that creates them.

This module owns the DDL. The queue itself is the queue library's (pgqueuer: its job, log and
statistics tables, its NOTIFY trigger), installed or upgraded by the library's own schema code.
Beside it live three tables of ours, for what the library does not keep:

* ``cuzk_fleet_jobs``: one row per job for its whole life: inputs reference, sha256 and size, state,
  the client that submitted it (its identity travels with the job, so the same client sees it
  at any box), the box and fleet instance holding the claim, claim and attempt counts, the boxes
  it failed on (its retries go elsewhere where they can, :mod:`.retries`), and the result,
  written once by a guarded update (``... WHERE state IN ('queued', 'running')``). The library's
  row exists only while the job is queued or picked.
* ``cuzk_fleet_requests``: request_id -> job_id, so the same request_id sent to any box makes one
  job, also after the job finished (until it is pruned with its job).
* ``cuzk_fleet_boxes``: each box's last heartbeat, resident keys, keys it is loading and free slots
  (fleet status, metrics and the key-loading decision).

:func:`migrate` runs at every :meth:`Fleet.connect`, under an advisory lock so
that boxes starting together do not race; every statement is safe to repeat. ``SCHEMA_VERSION``
is recorded for later migrations to build on (version 2 added ``cuzk_fleet_jobs.client``, version 3
``input_bytes``, what the ``[daemon] max_queued_input`` cap counts, version 4
``cuzk_fleet_boxes.stall_timeout_s``, each box's own, the longest of which makes a claim lapse, version 5
``cuzk_fleet_jobs.key_digest``, the key a done job was proved with, kept beside its result so that the
result stays readable to the boxes of earlier releases (:func:`cuzk_mp.daemon.protocol.stored_reply`),
version 6 the index of ``cuzk_fleet_jobs.inputs_sha256``, by which pruning asks whether a job still needs
a stored inputs file, version 7 ``cuzk_fleet_boxes.paused``, why a box claims nothing (its shared inputs
folder is broken there), so that ``fleet status`` says it, version 8 ``cuzk_fleet_jobs.failed_on``, the
boxes a job failed on, which its retries avoid where another box can take them, version 9
``cuzk_fleet_boxes.loading``, the keys a box is loading for the backlog, so that another idle box counts
it as their holder before the load ends, version 10 ``cuzk_fleet_boxes.loading_since`` and
``load_limit_s``, when that load began and for how long it counts as holding its key
(:func:`.keys.load_limit_s`: a load that hangs holds it no longer); the ``ALTER ... ADD
COLUMN IF NOT EXISTS`` statements bring an older database up to it, its rows counting 0 input bytes
and a 0 s stall timeout, their results naming no key, its boxes paused for nothing and loading no key
(a load of a box of schema 9, whose row records no start, holds its key for as long as that box is up,
as schema 9 counts it), its jobs failed on no box). Each version only adds columns with defaults and
indexes, so boxes of earlier releases keep working on the migrated database. A database that records
this version or a later one is left as it is (:func:`migrate`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg
    from pgqueuer.queries import Queries

log = logging.getLogger("cuzk_mp.daemon.fleet")

SCHEMA_VERSION = 10
# Advisory lock key: the ASCII of "cuzkflt1" as a signed 64-bit integer.
MIGRATION_LOCK_KEY = int.from_bytes(b"cuzkflt1", "big", signed=True)
# Transaction-level advisory lock of every submit that counts the queue against caps: the ASCII of
# "cuzksbm1" as a signed 64-bit integer (see Fleet.submit for the order it is taken in).
SUBMIT_LOCK_KEY = int.from_bytes(b"cuzksbm1", "big", signed=True)
# Transaction-level advisory locks of stored inputs, (INPUTS_LOCK_SPACE, the first 4 bytes of their sha256
# as a signed int4): a submit holds its inputs' lock from storing the file to its job row's commit, and
# pruning holds it from the check that no job needs the file to its removal (two int4 keys: a key space
# apart from the bigint locks above). The ASCII of "cuzi" as a signed int4.
INPUTS_LOCK_SPACE = int.from_bytes(b"cuzi", "big", signed=True)
# Transaction-level advisory lock of the key-loading decision (:meth:`.store.FleetStore.plan_load`): boxes
# woken together by one submit decide one after the other, each seeing the loads the others began. The
# ASCII of "cuzkkey1" as a signed 64-bit integer.
KEY_LOAD_LOCK_KEY = int.from_bytes(b"cuzkkey1", "big", signed=True)
QUEUE_PREFIX = "cuzk_"
EVENTS_CHANNEL = "cuzk_fleet_events"
MAX_RESULT_BYTES = 4 << 20
MAX_REF_CHARS = 4096
MAX_REQUEST_ID_CHARS = 256
# The most our DDL waits for a table's lock (see migrate): a box's operations hold them for milliseconds.
DDL_LOCK_TIMEOUT_S = 5.0

DDL = (
    """CREATE TABLE IF NOT EXISTS cuzk_fleet_meta (
        key   text PRIMARY KEY,
        value text NOT NULL
    )""",
    f"""CREATE TABLE IF NOT EXISTS cuzk_fleet_jobs (
        job_id        text PRIMARY KEY,
        request_id    text,
        circuit_id    text NOT NULL,
        priority      smallint NOT NULL CHECK (priority BETWEEN 0 AND 3),
        n_partitions  integer NOT NULL CHECK (n_partitions >= 1),
        inputs_ref    text NOT NULL CHECK (length(inputs_ref) BETWEEN 1 AND {MAX_REF_CHARS}),
        inputs_sha256 text NOT NULL CHECK (inputs_sha256 ~ '^[0-9a-f]{{64}}$'),
        queue_id      bigint,
        state         text NOT NULL DEFAULT 'queued'
                      CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
        box           text,
        owner         uuid,
        claims        integer NOT NULL DEFAULT 0,
        attempts      integer NOT NULL DEFAULT 0,
        submitted_by  text NOT NULL,
        client        text NOT NULL DEFAULT '',
        input_bytes   bigint NOT NULL DEFAULT 0 CHECK (input_bytes >= 0),
        submitted_at  timestamptz NOT NULL DEFAULT now(),
        started_at    timestamptz,
        finished_at   timestamptz,
        result        bytea CHECK (octet_length(result) <= {MAX_RESULT_BYTES}),
        error         text,
        error_kind    text,
        key_digest    text,
        failed_on     text[] NOT NULL DEFAULT '{{}}',
        CHECK (state <> 'done' OR result IS NOT NULL)
    )""",
    "ALTER TABLE cuzk_fleet_jobs ADD COLUMN IF NOT EXISTS client text NOT NULL DEFAULT ''",
    ("ALTER TABLE cuzk_fleet_jobs ADD COLUMN IF NOT EXISTS input_bytes bigint NOT NULL DEFAULT 0 "
     "CHECK (input_bytes >= 0)"),
    "ALTER TABLE cuzk_fleet_jobs ADD COLUMN IF NOT EXISTS key_digest text",
    "ALTER TABLE cuzk_fleet_jobs ADD COLUMN IF NOT EXISTS failed_on text[] NOT NULL DEFAULT '{}'",
    # the figures a submit counts against the caps: unfinished jobs, per client
    ("CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_unfinished ON cuzk_fleet_jobs (client) "
     "WHERE state IN ('queued', 'running')"),
    "CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_queue_id ON cuzk_fleet_jobs (queue_id)",
    # pruning asks, for each stale inputs file, whether a job needs its bytes (releases before the
    # second index asked whether a job names its path)
    "CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_inputs ON cuzk_fleet_jobs (inputs_ref)",
    "CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_inputs_sha256 ON cuzk_fleet_jobs (inputs_sha256)",
    ("CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_finished ON cuzk_fleet_jobs (finished_at) "
     "WHERE finished_at IS NOT NULL"),
    "CREATE INDEX IF NOT EXISTS cuzk_fleet_jobs_owner ON cuzk_fleet_jobs (owner) WHERE state = 'running'",
    f"""CREATE TABLE IF NOT EXISTS cuzk_fleet_requests (
        request_id  text PRIMARY KEY CHECK (length(request_id) BETWEEN 1 AND {MAX_REQUEST_ID_CHARS}),
        job_id      text NOT NULL REFERENCES cuzk_fleet_jobs (job_id)
                    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
        created_at  timestamptz NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS cuzk_fleet_requests_job ON cuzk_fleet_requests (job_id)",
    """CREATE TABLE IF NOT EXISTS cuzk_fleet_boxes (
        box             text PRIMARY KEY,
        instance        uuid NOT NULL,
        host            text NOT NULL,
        pid             integer NOT NULL,
        started_at      timestamptz NOT NULL DEFAULT now(),
        last_heartbeat  timestamptz NOT NULL DEFAULT now(),
        resident        text[] NOT NULL DEFAULT '{}',
        free_slots      integer NOT NULL DEFAULT 0,
        running         integer NOT NULL DEFAULT 0,
        left_at         timestamptz
    )""",
    ("ALTER TABLE cuzk_fleet_boxes ADD COLUMN IF NOT EXISTS stall_timeout_s double precision NOT NULL "
     "DEFAULT 0"),
    "ALTER TABLE cuzk_fleet_boxes ADD COLUMN IF NOT EXISTS paused text",
    "ALTER TABLE cuzk_fleet_boxes ADD COLUMN IF NOT EXISTS loading text[] NOT NULL DEFAULT '{}'",
    "ALTER TABLE cuzk_fleet_boxes ADD COLUMN IF NOT EXISTS loading_since timestamptz",
    "ALTER TABLE cuzk_fleet_boxes ADD COLUMN IF NOT EXISTS load_limit_s double precision",
)


def inputs_lock(sha256: str) -> tuple[int, int]:
    """The advisory lock key of the stored inputs of this sha256 (see INPUTS_LOCK_SPACE)."""
    return INPUTS_LOCK_SPACE, int.from_bytes(bytes.fromhex(sha256[:8]), "big", signed=True)


async def migrate(conn: psycopg.AsyncConnection, queries: Queries, idle_s: float) -> None:
    """Install or upgrade the queue library's schema, then create ours; safe to run concurrently.

    ``conn`` is an autocommit connection and ``queries`` the library's query object over it. The
    lock is session-level because the library's upgrade statements must not share a transaction.
    Every box's join (and every ``fleet status``) takes it, so a box that stopped while it held it
    (frozen by SIGSTOP or a debugger between two of these statements: its kernel still answers
    keepalives, and a session outside a transaction is never idle "in transaction") kept every other
    box from joining for as long as it stayed stopped. The session is ended once idle for ``idle_s``
    (the box's stall timeout; ``idle_session_timeout``, PostgreSQL 14 and later), freeing the lock.

    Our DDL runs only where the database records an older ``schema_version`` (every change to
    :data:`DDL` raises it): ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` takes the table's exclusive
    lock even when the column is there, so a box joining, or an observer (``fleet status``), queued
    that lock behind any transaction holding a job's row, and every box's statements on the table
    queued behind it: one box hung inside a transaction stalled the fleet.
    """
    if conn.info.server_version >= 140000:
        await conn.execute(f"SET idle_session_timeout = {math.ceil(idle_s * 1000)}")
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        if await queries.schema_is_installed():
            plan = await queries.apply_upgrade()
            if plan.statements:
                log.info("[start] fleet: upgraded the queue schema (%d statements)",
                         len(plan.statements))
        else:
            await queries.install()
            log.info("[start] fleet: installed the queue schema")
        if await recorded_version(conn) >= SCHEMA_VERSION:
            return
        async with conn.transaction():
            # Every box's statements on a table queue behind our DDL's wait for its exclusive lock; behind
            # a transaction that never ends (a box hung inside one, its session kept by the server for as
            # long as TCP keeps it) the whole fleet waited with it. This start fails instead, and is tried again.
            await conn.execute(f"SET LOCAL lock_timeout = '{int(DDL_LOCK_TIMEOUT_S * 1000)}ms'")
            for statement in DDL:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO cuzk_fleet_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = GREATEST(cuzk_fleet_meta.value::int, "
                "EXCLUDED.value::int)::text", (str(SCHEMA_VERSION),))
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        if conn.info.server_version >= 140000:
            await conn.execute("RESET idle_session_timeout")


async def recorded_version(conn: psycopg.AsyncConnection) -> int:
    """The ``schema_version`` the database records (0 before the fleet's tables exist)."""
    cur = await conn.execute("SELECT to_regclass('cuzk_fleet_meta') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute("SELECT value::int FROM cuzk_fleet_meta WHERE key = 'schema_version'")
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])
