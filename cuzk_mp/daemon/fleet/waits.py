"""Every read and write of the fleet's shared inputs folder, a call that may never return, on a thread of its own
(:func:`on_share`, through :func:`cuzk_mp.daemon.threads.on_daemon_thread`); such a call is waited for with a time
limit by :func:`cuzk_mp.daemon.threads.wait_shared`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from cuzk_mp.daemon.threads import on_daemon_thread

T = TypeVar("T")


def on_share(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)``, a read or write of the shared inputs folder, on a thread of its own
    (:func:`on_daemon_thread`): on a hard mount whose server is gone it never returns. On a thread of the
    loop's default executor each such call kept the daemon's process from exiting after its stop, and
    took one of the threads the daemon's other work (engine status, evictions, the journal) shares."""
    return on_daemon_thread(fn, *args, name=f"cuzk-fleet-share-{getattr(fn, '__name__', 'call')}")
