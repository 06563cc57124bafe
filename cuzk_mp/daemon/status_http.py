"""The HTTP status endpoint: GET /status (JSON), /metrics (Prometheus text), /healthz.

This module owns one small asyncio HTTP/1.1 server on ``[daemon] status_listen`` (no new
dependency, as in cuzk's hand-written server). It reads one request head (bounded: 8 KiB, 10 s),
answers it and closes the connection. Only GET and HEAD are served; other paths are 404 and other
methods 405 with an ``Allow`` header. The handlers are plain callables supplied by the server, so
this module knows nothing about jobs or the engine.

``/healthz`` answers 200 ``ok`` while the daemon is running, its engine healthy and its journal answering,
and 503 with what is wrong otherwise (starting, draining, "degraded: " and the cause, a journal whose
storage hangs), which is what ``scripts/wait-ready.sh`` and load balancers poll.

``/status`` takes the caller's token as ``Authorization: Bearer TOKEN`` (401 with
``WWW-Authenticate: Bearer realm="cuzk-mp"`` when the daemon requires tokens and none was sent, 403
when the one sent is unknown or, for ``?detail=1``, not an admin's) and ``?detail=1`` for paths and
process ids; what the caller may see is decided by the status handler (daemon.access). /metrics and
/healthz are open.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cuzk_mp.daemon.accept import AcceptServer, bind_tcp
from cuzk_mp.daemon.transport import Address, bind_unix
from cuzk_mp.errors import AuthError

log = logging.getLogger("cuzk_mp.daemon.http")

MAX_HEAD_BYTES = 8192
ALLOWED = ("GET", "HEAD")  # the methods served (a 405 lists them in its Allow header, RFC 9110)
CHALLENGE = 'Bearer realm="cuzk-mp"'  # a 401's WWW-Authenticate (RFC 9110 11.6.1, RFC 6750 3)
HEAD_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 10.0  # a reply the client does not take within this ends the connection
MAX_CONNECTIONS = 64  # connections served at once; more are closed unanswered (a scraper needs one)
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}


@dataclass
class StatusHandlers:
    """What the endpoint serves: async producers of the status dict and the metrics text,
    and a health probe returning (healthy, what is wrong or "ok")."""

    status: Callable[[bool, str], Awaitable[dict[str, Any]]]  # (detail, bearer token)
    metrics: Callable[[], Awaitable[str]]
    health: Callable[[], tuple[bool, str]]


def _response(code: int, body: bytes, content_type: str, head_only: bool, extra: str = "") -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{extra}"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n").encode()
    return head if head_only else head + body


@dataclass
class _Request:
    method: str
    path: str
    query: str
    token: str


async def _read_head(reader: asyncio.StreamReader) -> _Request | None:
    """The request line and bearer token, after reading the whole head; None if malformed."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
            ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    token = ""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "authorization" and value.strip()[:7].lower() == "bearer ":
            token = value.strip()[7:].strip()
    path, _, query = parts[1].partition("?")
    return _Request(parts[0], path, query, token)


async def _answer(handlers: StatusHandlers, req: _Request) -> bytes:
    method, path = req.method, req.path
    head_only = method == "HEAD"
    if method not in ALLOWED:
        return _response(405, f"method not allowed: use {', '.join(ALLOWED)}\n".encode(), "text/plain", False,
                         f"Allow: {', '.join(ALLOWED)}\r\n")
    if path == "/status":
        detail = any(p in ("detail", "detail=1", "detail=true", "detail=yes")
                     for p in req.query.split("&"))
        try:
            doc = await handlers.status(detail, req.token)
        except AuthError as e:
            if req.token:  # a token this daemon does not know, or not an admin's for ?detail
                return _response(403, f"{e}\n".encode(), "text/plain", head_only)
            return _response(401, f"{e}\n".encode(), "text/plain", head_only, f"WWW-Authenticate: {CHALLENGE}\r\n")
        body = json.dumps(doc, indent=1, default=str).encode()
        return _response(200, body + b"\n", "application/json", head_only)
    if path == "/metrics":
        text = await handlers.metrics()
        return _response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8",
                         head_only)
    if path == "/healthz":
        ok, state = handlers.health()
        return _response(200 if ok else 503, f"{state}\n".encode(), "text/plain", head_only)
    return _response(404, b"not found: try /status, /metrics or /healthz\n", "text/plain",
                     head_only)


async def start_status_server(addr: Address, handlers: StatusHandlers,
                              socket_mode: int = 0o600) -> AcceptServer:
    """Serve /status, /metrics and /healthz on a TCP ``addr`` (or a unix socket, created with
    ``socket_mode`` like the protocol socket; the caller unlinks it after closing)."""

    open_now = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if open_now[0] >= MAX_CONNECTIONS:
            writer.close()
            return
        open_now[0] += 1
        try:
            req = await _read_head(reader)
            if req is None:
                data = _response(400, b"bad request\n", "text/plain", False)
            else:
                try:
                    data = await _answer(handlers, req)
                except Exception:
                    log.exception("[http] %s %s failed", req.method, req.path)
                    data = _response(500, b"internal error (see the daemon log)\n",
                                     "text/plain", False)
            writer.write(data)
            async with asyncio.timeout(SEND_TIMEOUT_S):  # a client that reads nothing holds no memory for ever
                await writer.drain()
        except (ConnectionError, TimeoutError):
            pass
        finally:
            open_now[0] -= 1
            writer.close()

    sockets = [bind_unix(addr.path, socket_mode)] if addr.kind == "unix" else await bind_tcp(addr.host, addr.port)
    return AcceptServer(sockets, serve, f"status listener {addr}", limit=MAX_HEAD_BYTES)
