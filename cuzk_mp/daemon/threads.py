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

Such a call, or any awaitable, is waited for with a time limit without losing a cancel by :func:`wait_shared`
and :func:`within`: what ``asyncio.wait_for`` means, as it does not on Python 3.11. There a cancel that comes in
the moment the awaited thing ends is swallowed (``wait_for`` returns its result), and the caller went on as if
nothing had been asked: the share check of a stopping fleet box, the run of a job the box's stop or an abort gave
up (it went on reading its inputs and proving after its claim was gone), a client's wait for a job that read the
job again and waited on after the client had gone. ``asyncio.wait`` never cancels what it waits on and raises its
own cancel; both helpers are built on it, in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
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


def on_serial_thread(thread: SerialThread, fn: Callable[..., T], *args: Any,
                     began: list[float] | None = None) -> asyncio.Future[T]:
    """``fn(*args)`` on ``thread`` once the calls given to it before have ended (the journal's writes keep
    their order), its outcome the returned future's, as :func:`on_daemon_thread`'s; ``began`` gets the
    ``time.monotonic()`` at which it started (a wait for it may count its own time, not its turn's)."""
    call = _Call(fn, args, began)
    thread.call_soon(call.run)
    return call.fut


class _Call:
    """``fn(*args)`` run on some thread, its outcome handed to the future made on the caller's loop."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], began: list[float] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.fut: asyncio.Future[Any] = self.loop.create_future()
        self.fn, self.args, self.ctx, self.began = fn, args, contextvars.copy_context(), began

    def run(self) -> None:
        if self.began is not None:
            self.began.append(time.monotonic())
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


async def wait_shared(fut: asyncio.Future[T], timeout_s: float | None) -> T:
    """The result of ``fut`` within ``timeout_s`` (None: no limit), else TimeoutError; ``fut`` (a call on a
    thread of its own that later waiters share: a fleet box's marker read, a submit's key read) goes on
    either way, also where this waiter is cancelled: ``asyncio.wait_for(asyncio.shield(fut), timeout_s)``
    without its loss of a cancel."""
    done, _ = await asyncio.wait({fut}, timeout=timeout_s)
    if not done:
        raise asyncio.TimeoutError
    return fut.result()


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """The result of ``aw`` within ``timeout_s`` (None: no limit), else TimeoutError; ``aw`` is cancelled
    where it did not end, on the timeout or on a cancel of this waiter, which is raised, never lost:
    ``asyncio.wait_for(aw, timeout_s)`` without its loss of a cancel. What ``aw`` raises after it was
    given up on is dropped (a read cancelled in the middle may end with the database's error)."""
    task = asyncio.ensure_future(aw)
    try:
        return await wait_shared(task, timeout_s)
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(lambda f: f.cancelled() or f.exception())
