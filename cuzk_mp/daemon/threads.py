"""Calls that may never return, run off the asyncio loop on a thread the process's exit does not wait for.

A key file, the param cache, the circuit-data cache or the journal's folder may lie on a hard NFS
mount whose server went away: there open, read, stat and fsync never return. ``asyncio.to_thread``
runs a call on a thread of the loop's default executor, and such a thread is joined at the end of
``asyncio.run`` and at interpreter exit, so one stuck call kept the daemon's process from exiting
after its stop; and that executor has min(32, cores + 4) threads, so a few stuck calls took every one
of them and all the daemon's other work on threads (the engine's status, the other circuits' key
loads) queued behind them. :func:`on_daemon_thread` runs each such call on a daemon thread of its own;
:func:`on_serial_thread` runs calls that must keep their order (the journal's) on one daemon thread
(:class:`~cuzk_mp.pipeline.serial.SerialThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cuzk_mp.pipeline.serial import SerialThread

T = TypeVar("T")


def on_daemon_thread(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """``fn(*args)`` on a thread of its own named ``name``, its outcome the returned future's: what
    ``asyncio.to_thread`` does, for a call that may never return (a key read on a hard mount whose server
    is gone). A thread of the loop's default executor is joined at the end of ``asyncio.run`` and at
    interpreter exit, so one stuck call kept the daemon's process from exiting after its stop; a daemon
    thread is joined by neither. An outcome that comes after the loop closed is dropped."""
    call = _Call(fn, args)
    threading.Thread(target=call.run, name=name, daemon=True).start()
    return call.fut


def on_serial_thread(thread: SerialThread, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)`` on ``thread`` once the calls given to it before have ended (the journal's writes keep
    their order), its outcome the returned future's, as :func:`on_daemon_thread`'s."""
    call = _Call(fn, args)
    thread.call_soon(call.run)
    return call.fut


class _Call:
    """``fn(*args)`` run on some thread, its outcome handed to the future made on the caller's loop."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.loop = asyncio.get_running_loop()
        self.fut: asyncio.Future[Any] = self.loop.create_future()
        self.fn, self.args, self.ctx = fn, args, contextvars.copy_context()

    def run(self) -> None:
        value, error = None, None
        try:
            value = self.ctx.run(self.fn, *self.args)
        except BaseException as e:  # handed to the caller, as asyncio.to_thread does
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._hand_over, value, error)

    def _hand_over(self, value: Any, error: BaseException | None) -> None:  # on the loop
        if self.fut.done():  # cancelled: the caller gave it up
            return
        if error is None:
            self.fut.set_result(value)
        else:
            self.fut.set_exception(error)
