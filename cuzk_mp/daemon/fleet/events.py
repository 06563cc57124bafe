"""The fleet's LISTEN connection: wake-ups, cancellations and finished jobs, pushed by PostgreSQL.

This module owns one dedicated autocommit connection per box that LISTENs on two channels and
hands every notification to a callback, so nothing in the fleet polls for these:

* the queue library's channel (pgqueuer): ``table_changed_event`` when jobs are inserted or
  removed (a claim loop wakes up) and ``cancellation_event`` with the library's job ids (a
  cancel sent to any box reaches the box running the job);
* :data:`~.schema.EVENTS_CHANNEL`, ours: ``{"event": "finished", "job_id": ...}`` when a job
  reaches a final state (waiters in ``await_result`` wake up) and ``{"event": "requeued"}``
  when a job goes back to the queue (a claim loop wakes up).

Notifications sent while the connection is down are lost, so after a reconnect the owner's
``on_reconnect`` runs: it wakes every waiter to re-read the state and re-checks its claims.
Payloads are parsed with the library's own event model (``AnyEvent``); an unreadable payload is
logged and dropped, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from pgqueuer.domain import models as pgq_models
from psycopg import sql

log = logging.getLogger("cuzk_mp.daemon.fleet")

RECONNECT_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # each at most the box's reconnect_max_s


@dataclass
class EventHandlers:
    """What to do with each kind of notification (called on the event loop, must not block)."""

    on_work: Callable[[], None]
    on_cancel: Callable[[list[int]], None]
    on_finished: Callable[[str], None]
    on_reconnect: Callable[[], None]


class FleetEvents:
    """LISTEN on the queue's and the fleet's channels; reconnect with backoff when the link drops, waiting
    at most ``reconnect_max_s`` between two attempts (:class:`~.config.FleetConfig`)."""

    def __init__(self, dsn: str, channels: tuple[str, str], handlers: EventHandlers,
                 connect_kwargs: dict[str, Any], reconnect_max_s: float = RECONNECT_DELAYS_S[-1]) -> None:
        self.dsn, self.handlers = dsn, handlers
        self.delays_s = tuple(min(d, reconnect_max_s) for d in RECONNECT_DELAYS_S)
        self.queue_channel, self.fleet_channel = channels
        self.connect_kwargs = connect_kwargs  # the box's (store.connect_kwargs): keepalives find a dead link
        self._conn: psycopg.AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.reconnects = 0

    async def start(self) -> None:
        """Connect and LISTEN before returning, so no notification after this call is missed."""
        self._conn = await self._listen()
        self._task = asyncio.create_task(self._watch(), name="cuzk-fleet-listen")

    async def close(self) -> None:
        """Stop listening and close the connection."""
        self._closing = True  # the watch loop ends even where a cancel comes back as a psycopg error
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    async def _listen(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(self.dsn, **self.connect_kwargs)
        for channel in (self.queue_channel, self.fleet_channel):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return conn

    async def _watch(self) -> None:
        while not self._closing:
            assert self._conn is not None
            try:
                async for note in self._conn.notifies():
                    self._dispatch(note.channel, note.payload)
            except psycopg.Error as e:
                if self._closing:
                    return
                log.warning("fleet: LISTEN connection lost (%s); reconnecting", e)
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = await self._reconnect()
            self.reconnects += 1
            self.handlers.on_reconnect()

    async def _reconnect(self) -> psycopg.AsyncConnection:
        attempt = 0
        while True:
            await asyncio.sleep(self.delays_s[min(attempt, len(self.delays_s) - 1)])
            attempt += 1
            try:
                conn = await self._listen()
            except psycopg.Error as e:
                log.warning("fleet: LISTEN reconnect %d failed: %s", attempt, e)
                continue
            log.info("fleet: LISTEN connection restored after %d attempts", attempt)
            return conn

    def _dispatch(self, channel: str, payload: str) -> None:
        try:
            if channel == self.fleet_channel:
                self._fleet_event(json.loads(payload))
            else:
                self._queue_event(pgq_models.AnyEvent.model_validate_json(payload).root)
        except Exception:
            log.exception("fleet: dropped an unreadable notification on %s: %.200s", channel, payload)

    def _fleet_event(self, event: dict[str, object]) -> None:
        kind = event.get("event")
        if kind == "finished":
            self.handlers.on_finished(str(event["job_id"]))
        elif kind == "requeued":
            self.handlers.on_work()

    def _queue_event(self, event: object) -> None:
        if isinstance(event, pgq_models.CancellationEvent):
            self.handlers.on_cancel([int(i) for i in event.ids])
        elif isinstance(event, pgq_models.TableChangedEvent) and event.operation != "delete":
            self.handlers.on_work()
