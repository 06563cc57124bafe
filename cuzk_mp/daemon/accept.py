"""Accepting connections: the daemon's listeners, which outlive a shortage of file descriptors.

Why not ``asyncio.start_server``: when ``accept()`` fails for want of a descriptor (EMFILE: many
clients at once under a low ``LimitNOFILE``; ENFILE) or of kernel memory (ENOBUFS, ENOMEM), the
selector event loop's accept handler logs an error with a traceback and schedules a retry, then goes
on trying the same socket up to ``backlog`` (100) times in that pass, logging and scheduling a
retry for each; every retry does the same. While the shortage lasts that is hundreds of
tracebacks a second, more each second, and ever more timers: a flood in the service's journal
that also slows the loop every job depends on.

Here one task per listening socket awaits ``loop.sock_accept``. A shortage is logged as one
warning (what ran out, the limit, what to do; again each :data:`SHORTAGE_LOG_INTERVAL_S` while it
lasts), the task waits :data:`ACCEPT_RETRY_S` and tries again, and a line says when it accepts
again. Clients that connect meanwhile wait in the kernel's listen backlog and are served once
descriptors are free; the connections already accepted, and the jobs, go on.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("cuzk_mp.daemon.accept")

BACKLOG = 100  # connections the kernel holds for a listener that does not accept them yet (asyncio's default)
ACCEPT_RETRY_S = 0.5
SHORTAGE_LOG_INTERVAL_S = 60.0
_SHORTAGES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def shortage(e: OSError) -> str:
    """What ran out when ``accept()`` failed with ``e`` (one of EMFILE, ENFILE, ENOBUFS, ENOMEM), and
    what to do."""
    if e.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"this process has no file descriptor left (its limit is {soft}: raise LimitNOFILE in its "
                "systemd unit, or ulimit -n, or lower [daemon] max_connections)")
    if e.errno == errno.ENFILE:
        return "the system's file table is full (sysctl fs.file-max; other processes hold its files)"
    return f"the kernel has no memory for another socket ({e.strerror})"


class AcceptServer:
    """Listening sockets, each served by an accept task; :meth:`close` stops accepting and closes
    them (connections already accepted go on until their handlers end)."""

    def __init__(self, sockets: list[socket.socket], handler: Handler, what: str,
                 limit: int = 2**16) -> None:
        """Listen on the bound ``sockets`` (closed here if that fails) and serve each connection with
        ``handler``; ``what`` names the listener in the log, ``limit`` is the streams' buffer limit."""
        self._sockets = sockets
        self._handler, self._what, self._limit = handler, what, limit
        self._connections: set[asyncio.Task[None]] = set()
        self._acceptors: list[asyncio.Task[None]] = []
        try:
            for sock in sockets:
                sock.setblocking(False)
                sock.listen(BACKLOG)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        self._acceptors = [asyncio.ensure_future(self._accept(sock)) for sock in sockets]

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening sockets."""
        return list(self._sockets)

    def close(self) -> None:
        """Stop accepting (idempotent); each socket is closed once its accept task has ended."""
        for task, sock in zip(self._acceptors, self._sockets):
            task.add_done_callback(lambda _, sock=sock: sock.close())  # not while the loop still watches it
            task.cancel()

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        short_since: float | None = None  # when the running shortage began
        last_log = 0.0
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except ConnectionAbortedError:  # the client gave up before it was accepted
                continue
            except OSError as e:
                now = time.monotonic()
                why = shortage(e) if e.errno in _SHORTAGES else f"accept() failed: {e}"
                if short_since is None:
                    short_since = last_log = now
                    log.warning("%s: cannot accept connections: %s; clients wait in the listen backlog and are "
                                "served once it is over (trying again every %g s)", self._what, why, ACCEPT_RETRY_S)
                elif now - last_log >= SHORTAGE_LOG_INTERVAL_S:
                    last_log = now
                    log.warning("%s: still cannot accept connections after %.0f s: %s", self._what,
                                now - short_since, why)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if short_since is not None:
                log.info("%s: accepting connections again after %.1f s", self._what, time.monotonic() - short_since)
                short_since = None
            task = asyncio.ensure_future(self._serve(conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve(self, conn: socket.socket) -> None:
        """Run the handler on one accepted connection; its failure is logged, never the listener's."""
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=self._limit)
        except OSError as e:
            conn.close()
            log.warning("%s: a connection could not be set up: %s", self._what, e)
            return
        try:
            await self._handler(reader, writer)
        except Exception:  # noqa: BLE001 - one connection's bug must not reach the others or the listener
            log.exception("%s: serving a connection failed", self._what)
        finally:
            writer.close()


async def bind_tcp(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` resolves to (as ``asyncio.start_server`` binds them:
    SO_REUSEADDR, IPv6 sockets for IPv6 alone); an OSError names the address that cannot be bound."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                raise OSError(e.errno, f"error while attempting to bind on address {address!r}: "
                                       f"{(e.strerror or str(e)).lower()}") from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
