"""The shared job queue of a fleet of boxes: :class:`Fleet`, one per daemon process.

This module owns a box's side of the shared PostgreSQL queue: its claims (the jobs this process
holds, in memory and in the database), its heartbeat task, its LISTEN connection and its
registration in ``cuzk_fleet_boxes``; the database access and the read-only views are
:mod:`.store`'s, what a box does for its clients (submit, wait for a result) is
:mod:`.submits`'s, and the writes that end a run (result, failure, release, cancel) are
:mod:`.settles`'s (:class:`Fleet` is a :class:`~.settles.FleetSettles`, which is a
:class:`~.submits.FleetSubmits`). The queue mechanics
are pgqueuer's (see the package docstring for why): ``enqueue`` on submit, ``dequeue`` to claim
(``FOR UPDATE SKIP LOCKED``, priorities, one entrypoint per resident circuit, and re-picking of
jobs whose heartbeat is older than the stall timeout, all in one statement), ``update_heartbeat``,
``retry_job``, ``log_jobs`` and ``mark_job_as_cancelled`` (which NOTIFYs the box running the job). Our tables
(:mod:`.schema`) add what the library does not keep: the request-id table, the job's life and
its result written once, and the boxes.

Every operation is one transaction on a pooled connection, so a submit's request-id row, its
queue row and its job row commit together, and a result write, its queue row's removal and the
``finished`` notification commit together. Guards:

* ``complete`` writes the result only while the job is queued or running (the first valid
  result wins; a later one, from a box whose claim was taken over, is discarded and reported);
* ``fail`` and ``release`` act only while this process still holds the claim (``owner``), so a
  box that lost its claim cannot send a job that another box now runs back to the queue.
* every operation that settles a job locks its queue row before its job row, the order in which
  a claim takes them, so a cancel or a result racing a claim of the same job never deadlocks;
* ``submit`` (:mod:`.submits`) counts the fleet's unfinished jobs against the accepting box's ``[daemon]`` caps
  under a fleet-wide transaction lock taken before any row (:mod:`cuzk_mp.daemon.queue_caps`), so
  two boxes' submits racing at a cap never both pass.

Errors: bad arguments raise InputError naming the field; an unreachable database raises
ResourceError; neither ever loses another job's state, which lives in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Self

import psycopg
from pgqueuer.domain import models as pgq
from pgqueuer.domain.types import QueueEntrypoint, QueueManagerId
from pgqueuer.ports.repository import EntrypointExecutionParameter
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from cuzk_mp.daemon.fleet import retries, schema
from cuzk_mp.daemon.fleet.config import FleetConfig, check_fleet, redact_dsn
from cuzk_mp.daemon.fleet.events import EventHandlers, FleetEvents
from cuzk_mp.daemon.fleet.models import Claimed, entrypoint, lost_reason
from cuzk_mp.daemon.fleet.settles import FleetSettles, Held
from cuzk_mp.daemon.fleet.store import connect_kwargs, first_connection, new_pool, start_error
from cuzk_mp.errors import CuzkError, ResourceError
from cuzk_mp.pipeline.types import Priority

log = logging.getLogger("cuzk_mp.daemon.fleet")

AbortCallback = Callable[[str, str], None]


class Fleet(FleetSettles):
    """One box's handle on the shared queue; create with :meth:`connect`, end with :meth:`close`."""

    def __init__(self, cfg: FleetConfig, pool: AsyncConnectionPool, on_abort: AbortCallback | None) -> None:
        super().__init__(cfg, pool)
        self._on_abort = on_abort
        self._work = asyncio.Event()
        self._resident: tuple[str, ...] = ()
        self._free_slots = 0
        self._row: tuple[frozenset[str], bool] = (frozenset(), False)  # the row's last keys, and a free slot
        self.paused: str | None = None  # why this box claims nothing, recorded at each heartbeat (fleet status)
        self._events = FleetEvents(cfg.dsn, (self._settings.channel, schema.EVENTS_CHANNEL), EventHandlers(
            on_work=self._work.set, on_cancel=self._on_cancel, on_finished=self._wake_waiters,
            on_reconnect=self._on_reconnect), connect_kwargs(cfg), cfg.reconnect_max_s)
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._registered = False
        self._name_lost = False
        self._lapse_s = cfg.stall_timeout_s  # when a claim lapses here: the longest stall timeout of the boxes

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def connect(cls, dsn: str, box: str, *, on_abort: AbortCallback | None = None,
                      heartbeats: bool = True, register: bool = True, **knobs: Any) -> Fleet:
        """Connect box ``box`` to the queue at ``dsn``; ``knobs`` are FleetConfig fields."""
        return await cls.from_config(FleetConfig(dsn=dsn, box=box, **knobs), on_abort=on_abort,
                                     heartbeats=heartbeats, register=register)

    @classmethod
    async def from_config(cls, cfg: FleetConfig, *, on_abort: AbortCallback | None = None,
                          heartbeats: bool = True, register: bool = True) -> Fleet:
        """Connect, migrate the schema, register this box, LISTEN and start heartbeating.

        ``on_abort(job_id, reason)`` is called (on the event loop) when a job this box holds
        must stop: cancelled from any box, finished elsewhere, or its claim taken over.
        ``heartbeats=False`` leaves the renewal to explicit :meth:`heartbeat` calls;
        ``register=False`` connects an observer (status, metrics) that is not listed as a box.
        """
        check_fleet(cfg, "fleet")
        first = await first_connection(cfg)  # a wrong DSN fails at once, with the server's reason
        pool = new_pool(cfg)
        fleet = cls(cfg, pool, on_abort)
        try:
            try:
                async with first:
                    await schema.migrate(first, fleet._queries(first), cfg.stall_timeout_s)
            except psycopg.Error as e:
                raise start_error(cfg, e, "the fleet's tables", "create or upgrade the fleet's tables in") from None
            try:
                await pool.open(wait=True, timeout=cfg.connect_timeout_s)
            except PoolTimeout:
                raise ResourceError(f"fleet: cannot connect to {redact_dsn(cfg.dsn)} within "
                                    f"{cfg.connect_timeout_s:g} s") from None
            if register:
                await fleet._register()
            try:
                await fleet._events.start()
            except psycopg.Error as e:
                raise start_error(cfg, e, "the LISTEN connection", "open the LISTEN connection to") from None
        except BaseException:
            await fleet._events.close()
            await pool.close()
            raise
        if heartbeats and register:
            fleet._heartbeat_task = asyncio.create_task(fleet._heartbeat_loop(),
                                                        name=f"cuzk-fleet-heartbeat-{cfg.box}")
        log.info("[start] fleet: box %s (instance %s) joined %s", cfg.box, fleet.instance,
                 redact_dsn(cfg.dsn))
        return fleet

    async def close(self) -> None:
        """Release held claims back to the queue, mark the box as left, and disconnect."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        with contextlib.suppress(CuzkError, psycopg.Error):
            for job_id in list(self._held):
                await self.release(job_id)
            async with self._tx() as (conn, _):
                await conn.execute("UPDATE cuzk_fleet_boxes SET left_at = now(), free_slots = 0, running = 0, "
                                   "loading = '{}', loading_since = NULL, load_limit_s = NULL WHERE box = %s "
                                   "AND instance = %s", (self.box, self.instance))
        await self._events.close()
        await self._pool.close()
        for waiters in self._waiters.values():
            for ev in waiters:
                ev.set()
        log.info("[shutdown] fleet: box %s left", self.box)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _register(self) -> None:
        self._registered = True
        async with self._tx() as (conn, _):
            cur = await conn.execute(
                "SELECT host, pid, extract(epoch FROM now() - last_heartbeat) FROM cuzk_fleet_boxes "
                "WHERE box = %s AND left_at IS NULL FOR UPDATE", (self.box,))
            prev = await cur.fetchone()
            if prev is not None and prev[2] < self.cfg.stall_timeout_s:
                log.warning("fleet: box name %s was in use by pid %s on %s (heartbeat %.1f s ago); "
                            "this process takes it over", self.box, prev[1], prev[0], prev[2])
            await conn.execute(
                "INSERT INTO cuzk_fleet_boxes (box, instance, host, pid, stall_timeout_s) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (box) DO UPDATE SET instance = EXCLUDED.instance, host = EXCLUDED.host, "
                "pid = EXCLUDED.pid, started_at = now(), last_heartbeat = now(), resident = '{}', "
                "free_slots = 0, running = 0, left_at = NULL, stall_timeout_s = EXCLUDED.stall_timeout_s, "
                "paused = NULL, loading = '{}', loading_since = NULL, load_limit_s = NULL",
                (self.box, self.instance, socket.gethostname(), os.getpid(), self.cfg.stall_timeout_s))
            await self._read_lapse(conn)

    async def _read_lapse(self, conn: Any) -> None:
        """When a claim lapses for this box: after the longest ``stall_timeout`` of the boxes in the fleet
        (not left), its own included. A box's claims lapse by the timeout of the box that claims them
        again, which knows only its own; were it shorter than the holder's (boxes configured apart: a
        holder renewing every 20 s, a claimer that takes over after 15), running jobs would be taken
        over from live boxes, again and again, for nothing.

        A box silent for longer than its own stall timeout counts no more (its claims, renewed with its
        row, have lapsed by its own rule): a box with a long one that died without leaving (SIGKILL,
        power) made every stalled claim of the fleet wait that long, until pruning removed its row."""
        longest = await self._longest_stall_s(conn)
        if longest > self._lapse_s:
            log.warning("fleet: box %s takes over a stalled claim after %.1f s, not its own stall_timeout %.1f s: "
                        "another box of the fleet has that stall_timeout (give the boxes one)", self.box, longest,
                        self.cfg.stall_timeout_s)
        self._lapse_s = longest

    # -- claims ---------------------------------------------------------------------------

    async def claim(self, resident_circuits: Sequence[str], capacity: int) -> list[Claimed]:
        """Claim up to ``capacity`` jobs of the circuits whose keys this box holds, best first.

        Jobs whose box stopped renewing its claim for ``stall_timeout`` are claimed again here; that
        run counts as a failed attempt (its box was killed, ran out of memory, or lost the database),
        and a job whose attempts are used up so ends ``failed`` (:func:`.retries.fail_lapsed`) instead of being
        taken over for ever: a job that kills every box that runs it would take the fleet down box by box.
        A retry still waiting after failing on other boxes is claimed here at once (:mod:`.retries`).
        Keys or a free slot the box's row does not show yet go to it first (:meth:`_record_keys`).
        """
        self._resident, self._free_slots = tuple(resident_circuits), max(capacity, 0)
        if capacity <= 0 or not resident_circuits:
            return []
        eps = {QueueEntrypoint(entrypoint(c)): EntrypointExecutionParameter(concurrency_limit=0)
               for c in resident_circuits}
        async with self._tx() as (conn, queries):
            await self._record_keys(conn)
            taken = await retries.take_retries(conn, self._queue_table, self.box, list(eps), capacity)
            picked = await queries.dequeue(
                batch_size=capacity, entrypoints=eps, queue_manager_id=QueueManagerId(self.instance),
                global_concurrency_limit=None, heartbeat_timeout=timedelta(seconds=self._lapse_s))
            await retries.put_back(conn, self._queue_table, taken, {int(j.id) for j in picked})
            if not picked:
                return []
            lapsed, ended = await retries.fail_lapsed(conn, queries, self.cfg, self.instance, picked)
            picked = [j for j in picked if int(j.id) not in ended]
            if not picked:
                return []
            cur = await conn.cursor(row_factory=dict_row).execute(
                "UPDATE cuzk_fleet_jobs SET state = 'running', box = %s, owner = %s, claims = claims + 1, "
                "started_at = COALESCE(started_at, now()) WHERE queue_id = ANY(%s) "
                "AND state IN ('queued', 'running') RETURNING job_id, queue_id, circuit_id, priority, "
                "inputs_ref, inputs_sha256, n_partitions, attempts, claims, request_id, client, "
                "extract(epoch FROM submitted_at) AS submitted_at, "
                "extract(epoch FROM now() - submitted_at) AS queued_s",
                (self.box, self.instance, [int(j.id) for j in picked]))
            rows = {int(r["queue_id"]): r for r in await cur.fetchall()}
            orphans = [j for j in picked if int(j.id) not in rows]
            if orphans:  # queue rows without a live job: settle them so no box picks them again
                await queries.log_jobs([(j, "deleted", None) for j in orphans])
        return [c for j in picked
                if int(j.id) in rows and (c := self._hold(rows[int(j.id)], j, int(j.id) in lapsed)) is not None]

    def _hold(self, row: dict[str, Any], queue_job: pgq.Job, lapsed: bool) -> Claimed | None:
        """Record a claim; None if this process already runs the job (its own lapsed claim re-picked).
        ``lapsed``: the job was running under another process's claim, which lapsed."""
        if row["job_id"] in self._held:
            log.warning("fleet: box %s renewed its own lapsed claim on job %s (heartbeats failed for "
                        "longer than the stall timeout)", self.box, row["job_id"])
            self._held[row["job_id"]].queue_job = queue_job
            return None
        c = Claimed(job_id=row["job_id"], circuit_id=row["circuit_id"], priority=Priority(row["priority"]),
                    inputs_ref=row["inputs_ref"], inputs_sha256=row["inputs_sha256"],
                    n_partitions=row["n_partitions"], attempts=row["attempts"], claims=row["claims"],
                    request_id=row["request_id"], client=row["client"],
                    submitted_at=float(row["submitted_at"]), queued_s=max(float(row["queued_s"]), 0.0),
                    claimed_at=time.time(), claimed_mono=time.monotonic())
        self._held[c.job_id] = Held(c, queue_job)
        self._by_queue_id[int(queue_job.id)] = c.job_id
        if lapsed:
            log.warning("fleet: box %s claimed job %s again (claim %d, attempt %d): its previous box stopped "
                        "renewing it", self.box, c.job_id, c.claims, c.attempts + 1)
        elif c.claims > 1:
            log.info("fleet: box %s claimed job %s again (claim %d: after a failed attempt or a box's stop)",
                     self.box, c.job_id, c.claims)
        else:
            log.info("fleet: box %s claimed job %s (%s)", self.box, c.job_id, c.circuit_id)
        return c

    def forget(self, job_id: str) -> None:
        """Stop renewing a claim without touching the database: the job lapses to another box."""
        self._unanswered.pop(job_id, None)
        self._drop(job_id)

    def held(self) -> list[Claimed]:
        """The jobs this process holds now."""
        return [h.claimed for h in self._held.values()]

    async def wait_for_work(self, timeout_s: float) -> bool:
        """Sleep until a job may have become claimable (NOTIFY) or ``timeout_s``; True if woken."""
        try:
            await asyncio.wait_for(self._work.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._work.clear()

    async def _record_keys(self, conn: Any) -> None:
        """The box's row takes its resident keys and free slots where its keys changed since it was last
        written or it showed no free slot: it lists the key of every job claimed here from the claim on,
        and a box whose job ended since a heartbeat found it full is not taken for one that claims
        nothing (docs/fleet.md, "Claim"). The row is locked before any job, as the heartbeat locks it."""
        row = (frozenset(self._resident), self._free_slots > 0)
        if row == self._row:
            return
        await conn.execute("UPDATE cuzk_fleet_boxes SET resident = %s, free_slots = %s "
                           "WHERE box = %s AND instance = %s",
                           (list(self._resident), self._free_slots, self.box, self.instance))
        self._row = row

    # -- heartbeat ------------------------------------------------------------------------

    async def heartbeat(self) -> list[str]:
        """Renew this box's row and its claims; the job ids it lost (they are aborted too).

        A claim is lost when the job was cancelled, finished by another box, or claimed again
        elsewhere after this box's heartbeat stalled. A box whose row was pruned (it was silent
        longer than ``result_ttl`` with no claim, see :meth:`prune`) registers again here.
        """
        lost: dict[str, str] = {}
        # The claims as they are now: claim() and complete() may change self._held while this
        # transaction awaits, and a job claimed after the read below must not look "removed";
        # nor may a job this box settled and claimed again meanwhile lose its new claim for
        # what the read said of the old one (see the end).
        checked = dict(self._held)
        async with self._tx() as (conn, queries):
            resident, free = self._resident, self._free_slots
            # the row is this process's, or free again: the process that took the name over has left,
            # or has not renewed it for longer than the stall timeout (killed)
            cur = await conn.execute(
                "UPDATE cuzk_fleet_boxes SET last_heartbeat = now(), resident = %s, free_slots = %s, "
                "running = %s, left_at = NULL, instance = %s, host = %s, pid = %s, stall_timeout_s = %s, "
                "paused = %s, loading = %s, loading_since = CASE WHEN %s THEN COALESCE(loading_since, now()) END, "
                "load_limit_s = %s WHERE box = %s AND (instance = %s OR left_at IS NOT NULL "
                "OR last_heartbeat < now() - make_interval(secs => %s))",
                (list(resident), free, len(checked), self.instance, socket.gethostname(),
                 os.getpid(), self.cfg.stall_timeout_s, self.paused, list(self.loading), bool(self.loading),
                 self.load_limit_s, self.box, self.instance, self.cfg.stall_timeout_s))
            if cur.rowcount == 0 and self._registered:  # the row is gone if prune took this box for dead
                cur = await conn.execute(
                    "INSERT INTO cuzk_fleet_boxes (box, instance, host, pid, resident, free_slots, running, "
                    "stall_timeout_s, paused, loading, loading_since, load_limit_s) VALUES (%s, %s, %s, %s, %s, %s, "
                    "%s, %s, %s, %s, CASE WHEN %s THEN now() END, %s) ON CONFLICT (box) DO NOTHING",
                    (self.box, self.instance, socket.gethostname(), os.getpid(), list(resident), free,
                     len(checked), self.cfg.stall_timeout_s, self.paused, list(self.loading), bool(self.loading),
                     self.load_limit_s))
                if cur.rowcount == 1:
                    log.warning("fleet: box %s had not renewed its row for so long that it was pruned; it "
                                "joins again", self.box)
            if cur.rowcount == 0 and self._registered and not self._name_lost:
                self._name_lost = True  # claims stay safe (they carry this process's instance id)
                log.error("fleet: another process took over box name %s; give each daemon its own "
                          "[fleet] box", self.box)
            elif cur.rowcount == 1 and self._name_lost:
                self._name_lost = False
                log.warning("fleet: box name %s is free again (the process that took it over left or "
                            "stalled); this process holds it again", self.box)
            if cur.rowcount == 1:
                self._row = (frozenset(resident), free > 0)
            await self._read_lapse(conn)
            if checked:
                cur = await conn.execute("SELECT job_id, state, owner, box FROM cuzk_fleet_jobs "
                                         "WHERE job_id = ANY(%s)", (list(checked),))
                rows = {r[0]: r for r in await cur.fetchall()}
                for job_id in checked:
                    reason = lost_reason(rows.get(job_id), self.instance)
                    if reason:
                        lost[job_id] = reason
                keep = [h.queue_job.id for j in checked if j not in lost and (h := self._held.get(j)) is not None]
                if keep:
                    await queries.update_heartbeat(keep)
        for job_id in [j for j in lost if self._held.get(j, checked[j]) is not checked[j]]:
            del lost[job_id]  # claimed again while this ran: the read was about the claim before
        for job_id, reason in lost.items():
            self._abort(job_id, reason)
        return list(lost)

    async def _heartbeat_loop(self) -> None:
        # Ends when the box closes, whether or not the cancel reaches it as CancelledError: a cancel
        # that lands inside a query comes back from psycopg as QueryCanceled, which _tx turns into a
        # ResourceError like any database error; a loop that only logged it ran on for ever, and
        # close(), awaiting it, never returned.
        while not self._closed:
            await asyncio.sleep(self.cfg.heartbeat_interval_s)
            if self._closed:
                return
            try:
                await self.heartbeat()
            except CuzkError as e:
                if self._closed:
                    return
                log.warning("fleet: heartbeat of box %s failed: %s", self.box, e)

    def _abort(self, job_id: str, reason: str) -> None:
        claimed = self._drop(job_id)
        if claimed is None:
            return
        claimed.abort_reason = reason
        claimed.aborted.set()
        log.info("fleet: box %s stops job %s: %s", self.box, job_id, reason)
        if self._on_abort is not None:
            try:
                self._on_abort(job_id, reason)
            except Exception:
                log.exception("fleet: on_abort(%s) raised", job_id)

    def _on_cancel(self, queue_ids: list[int]) -> None:
        for qid in queue_ids:
            job_id = self._by_queue_id.get(qid)
            if job_id is not None:
                self._abort(job_id, "cancelled")

    def _on_reconnect(self) -> None:
        task = asyncio.get_running_loop().create_task(self._after_reconnect())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _after_reconnect(self) -> None:
        """The database answers again: a fresh pool first (:meth:`renew_pool`), then every waiter
        re-reads its job, the claim loop looks for work, and held claims are renewed."""
        with contextlib.suppress(Exception):
            await self.renew_pool()
        for job_id in list(self._waiters):
            self._wake_waiters(job_id)
        self._work.set()
        if self._held and not self._closed:
            await self._heartbeat_quietly()

    async def _heartbeat_quietly(self) -> None:
        with contextlib.suppress(CuzkError):
            await self.heartbeat()
