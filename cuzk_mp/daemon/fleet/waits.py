"""Waiting with a time limit without losing a cancel: what ``asyncio.wait_for`` means, as it does not on
Python 3.11; and every read and write of the shared inputs folder, a call that may never return, on a thread of
its own (:func:`on_share`, through :func:`cuzk_mp.daemon.threads.on_daemon_thread`).

There a cancel that comes in the moment the awaited thing ends is swallowed (``wait_for`` returns its
result), and the caller went on as if nothing had been asked: the share check of a stopping box, the
run of a job the box's stop or an abort gave up (it went on reading its inputs and proving after its
claim was gone), a client's wait for a job that read the job again and waited on after the client had
gone. ``asyncio.wait`` never cancels what it waits on and raises its own cancel; both helpers here are
built on it, in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cuzk_mp.daemon.threads import on_daemon_thread

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


def on_share(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)``, a read or write of the shared inputs folder, on a thread of its own
    (:func:`on_daemon_thread`): on a hard mount whose server is gone it never returns. On a thread of the
    loop's default executor each such call kept the daemon's process from exiting after its stop, and
    took one of the threads the daemon's other work (engine status, evictions, the journal) shares."""
    return on_daemon_thread(fn, *args, name=f"cuzk-fleet-share-{getattr(fn, '__name__', 'call')}")
