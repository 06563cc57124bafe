"""Keepalive probes on the TCP connections of the daemon's protocol, at both ends.

A peer whose host vanished (power lost, a cable pulled, a VM destroyed) sends no FIN or RST, and a
connection with nothing to send looks open for ever: a ``client await`` without ``--timeout`` waited
for ever on a proving box that had rebooted (a batch script with it), and the daemon kept a vanished
client's connection, one of its ``max_connections``, until it next wrote to it and the kernel gave up
after its retransmissions (~15 minutes). With probes after :data:`KEEPALIVE_IDLE_S` of silence, every
:data:`KEEPALIVE_INTERVAL_S`, :data:`KEEPALIVE_COUNT` unanswered ones reset the connection: the wait
ends with a ConnectionError within about a minute. A live peer's kernel answers the probes, so a long
wait for a proof is not cut short; ``TCP_USER_TIMEOUT`` gives data that is sent and never acknowledged
the same minute. Unix sockets have no peer to lose and are left as they are; an option this kernel
lacks is skipped.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3


def keep_alive(sock: Any) -> None:
    """Turn the probes on for ``sock`` (a socket, or asyncio's view of one) where it is TCP."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    given_up_ms = 1000 * (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", given_up_ms)):
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
