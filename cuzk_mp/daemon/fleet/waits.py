"""Waiting with a time limit without losing a cancel: what ``asyncio.wait_for`` means, as it does not on
Python 3.11; and a call on a thread that may never return (:func:`on_daemon_thread`), such as every
read and write of the shared inputs folder (:func:`on_share`).

There a cancel that comes in the moment the awaited thing ends is swallowed (``wait_for`` returns its
result), and the caller went on as if nothing had been asked: the share check of a stopping box, the
run of a job the box's stop or an abort gave up (it went on reading its inputs and proving after its
claim was gone), a client's wait for a job that read the job again and waited on after the client had
gone. ``asyncio.wait`` never cancels what it waits on and raises its own cancel; both helpers here are
built on it, in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_shared(fut: asyncio.Future[T], timeout_s: float | None) -> T:
    """The result of ``fut`` within ``timeout_s`` (None: no limit), else TimeoutError; ``fut`` (a marker
    read or write on a worker thread, which later checks share: :meth:`.box.FleetBox._read_share`) goes on
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


def on_share(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)``, a read or write of the shared inputs folder, on a thread of its own
    (:func:`on_daemon_thread`): on a hard mount whose server is gone it never returns. On a thread of the
    loop's default executor each such call kept the daemon's process from exiting after its stop, and
    took one of the threads the daemon's other work (engine status, evictions, the journal) shares."""
    return on_daemon_thread(fn, *args, name=f"cuzk-fleet-share-{getattr(fn, '__name__', 'call')}")
