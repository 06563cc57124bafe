"""Calls that may never return, run off the asyncio loop on a thread the process's exit does not wait for.

A key file, the param cache, the circuit-data cache or the journal's folder may lie on a hard NFS
mount whose server went away: there open, read, stat and fsync never return. ``asyncio.to_thread``
runs a call on a thread of the loop's default executor, and such a thread is joined at the end of
``asyncio.run`` and at interpreter exit, so one stuck call kept the daemon's process from exiting
after its stop; and that executor has min(32, cores + 4) threads, so a few stuck calls took every one
of them and all the daemon's other work on threads (the engine's status, the other circuits' key
loads) queued behind them. :func:`on_daemon_thread` runs each such call on a daemon thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def on_daemon_thread(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """``fn(*args)`` on a thread of its own named ``name``, its outcome the returned future's: what
    ``asyncio.to_thread`` does, for a call that may never return (a key read on a hard mount whose server
    is gone). A thread of the loop's default executor is joined at the end of ``asyncio.run`` and at
    interpreter exit, so one stuck call kept the daemon's process from exiting after its stop; a daemon
    thread is joined by neither. An outcome that comes after the loop closed is dropped."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def hand_over(value: Any, error: BaseException | None) -> None:  # on the loop
        if fut.done():  # cancelled: the caller gave it up
            return
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)

    def run() -> None:
        value, error = None, None
        try:
            value = ctx.run(fn, *args)
        except BaseException as e:  # handed to the caller, as asyncio.to_thread does
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(hand_over, value, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut
