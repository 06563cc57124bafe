"""The HTTP status endpoint: GET /status (JSON), /metrics (Prometheus text), /healthz.

This module owns one small asyncio HTTP/1.1 server on ``[daemon] status_listen`` (no new
dependency, as in cuzk's hand-written server). It reads one request
head (bounded: 8 KiB, 10 s), answers it and closes the connection. Only GET and HEAD are served;
other paths are 404 and other methods 405. The handlers are plain callables supplied by the
server, so this module knows nothing about jobs or the engine.

``/healthz`` answers 200 ``ok`` while the daemon is running and its engine healthy, and 503 with
what is wrong otherwise (starting, draining, or "degraded: " and the cause), which is what
``scripts/wait-ready.sh`` and load balancers poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cuzk_mp.daemon.transport import Address, bind_unix

log = logging.getLogger("cuzk_mp.daemon.http")

MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 10.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class StatusHandlers:
    """What the endpoint serves: async producers of the status dict and the metrics text,
    and a health probe returning (healthy, what is wrong or "ok")."""

    status: Callable[[], Awaitable[dict[str, Any]]]
    metrics: Callable[[], Awaitable[str]]
    health: Callable[[], tuple[bool, str]]


def _response(code: int, body: bytes, content_type: str, head_only: bool) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n").encode()
    return head if head_only else head + body


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """(method, path) of the request line, after reading the whole head; None if malformed."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
            ConnectionError):
        return None
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    return parts[0], parts[1].split("?", 1)[0]


async def _answer(handlers: StatusHandlers, method: str, path: str) -> bytes:
    head_only = method == "HEAD"
    if method not in ("GET", "HEAD"):
        return _response(405, b"method not allowed\n", "text/plain", False)
    if path == "/status":
        body = json.dumps(await handlers.status(), indent=1, default=str).encode()
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
                              socket_mode: int = 0o600) -> asyncio.AbstractServer:
    """Serve /status, /metrics and /healthz on a TCP ``addr`` (or a unix socket, created with
    ``socket_mode`` like the protocol socket; the caller unlinks it after closing)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await _read_head(reader)
            if req is None:
                data = _response(400, b"bad request\n", "text/plain", False)
            else:
                try:
                    data = await _answer(handlers, *req)
                except Exception:
                    log.exception("[http] %s %s failed", *req)
                    data = _response(500, b"internal error (see the daemon log)\n",
                                     "text/plain", False)
            writer.write(data)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    if addr.kind == "unix":
        return await asyncio.start_unix_server(serve, sock=bind_unix(addr.path, socket_mode),
                                               limit=MAX_HEAD_BYTES)
    return await asyncio.start_server(serve, addr.host, addr.port, limit=MAX_HEAD_BYTES,
                                      reuse_address=True)
