"""Operations glue for the daemon process: log formatting and systemd notification.

This module owns the daemon's logging configuration (``[logging] level`` and ``format``: plain
text lines, or one JSON object per line for log shippers; cuzk accepted ``logging.format`` and
ignored it) and :func:`sd_notify`, the systemd ``Type=notify`` protocol spoken directly over the
``$NOTIFY_SOCKET`` datagram socket (no libsystemd binding needed): ``READY=1`` once the daemon
serves, ``STOPPING=1`` when it starts draining, ``STATUS=...`` for ``systemctl status``.
"""

from __future__ import annotations

import logging
import os
import socket

from ..logs import configure, export_for_children

def setup_logging(level: str, fmt: str) -> None:
    """Configure the daemon's logging, and its engine children's through the environment."""
    configure(level, fmt)
    export_for_children(level, fmt)


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; False when not run under Type=notify.

    ``$NOTIFY_SOCKET`` is a path or, with a leading ``@``, a Linux abstract socket name. The send never
    waits: the daemon's loop sends its watchdog pings, and a datagram queue that systemd does not empty
    (ten datagrams by default) would otherwise block the loop; such a message is dropped and logged.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    target = "\0" + addr[1:] if addr.startswith("@") else addr
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.setblocking(False)
            s.connect(target)
            s.sendall(state.encode())
    except OSError as e:
        logging.getLogger("cuzk_mp.daemon").warning("sd_notify(%s) failed: %s", state, e)
        return False
    return True
