"""Blocking sockets and frames for the synchronous client (:class:`~.client.Client`) and the warm-daemon starter.

The framing is :mod:`.transport`'s (a big-endian u32 length, then the bytes; the length checked before the body
is read); here it is read and written on a plain blocking socket with a deadline, which a one-call command
line needs rather than an event loop. Only replies are read here, so a length over the limit whose bytes are
another server's words (an SSH server's greeting, a TLS record) is said to be that (:func:`.transport.foreign_reply`):
a client pointed at the wrong port learns it could not reach the daemon, not that a frame was too large.
"""

from __future__ import annotations

import contextlib
import socket

from cuzk_mp.daemon.tcp_keepalive import keep_alive
from cuzk_mp.daemon.transport import (
    FRAME_HEAD_BYTES, HEADER_BYTES, Address, CommClosedError, FrameTooLarge, foreign_reply, frame, frame_length,
)


def open_socket(addr: Address, timeout: float | None) -> socket.socket:
    """A connected blocking socket for the synchronous client; one whose connect fails is closed here
    (as socket.create_connection closes its own), not left to the collector."""
    if addr.kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(addr.path)
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection((addr.host, addr.port), timeout=timeout)
    keep_alive(sock)
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise CommClosedError("daemon closed the connection")
        buf += chunk
    return bytes(buf)


def _arrived(sock: socket.socket) -> bytes:
    """What has arrived on ``sock`` already, up to FRAME_HEAD_BYTES, without waiting for more."""
    with contextlib.suppress(OSError):
        return sock.recv(FRAME_HEAD_BYTES, socket.MSG_DONTWAIT)
    return b""


def send_frame(sock: socket.socket, payload: bytes, max_frame_bytes: int) -> None:
    """Blocking: send one frame."""
    if len(payload) > max_frame_bytes:
        raise FrameTooLarge(f"frame of {len(payload)} bytes exceeds max_frame_bytes "
                            f"({max_frame_bytes})")
    sock.sendall(frame(payload))


def recv_frame(sock: socket.socket, max_frame_bytes: int) -> bytes:
    """Blocking: receive one reply frame (length checked first: :func:`.transport.frame_length`; another
    server's words where its length should be: :class:`.transport.NotTheProtocol`)."""
    header = _recv_exactly(sock, HEADER_BYTES)
    try:
        n = frame_length(header, max_frame_bytes)
    except FrameTooLarge:
        foreign = foreign_reply(header, _arrived(sock))
        if foreign is None:
            raise
        raise foreign from None
    return _recv_exactly(sock, n)
