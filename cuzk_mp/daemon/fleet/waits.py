"""Every read and write of the fleet's shared inputs folder, a call that may never return, on a thread of its own
(:func:`on_share`, through :func:`cuzk_mp.daemon.threads.on_daemon_thread`); such a call is waited for with a time
limit by :func:`cuzk_mp.daemon.threads.wait_shared`, and a client's submit waits for its own calls on the folder
as long as a single box's submit waits for its key file and journal (:func:`share_within`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from cuzk_mp.daemon import storage_waits
from cuzk_mp.daemon.threads import on_daemon_thread, wait_shared
from cuzk_mp.errors import Unavailable

T = TypeVar("T")


def on_share(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)``, a read or write of the shared inputs folder, on a thread of its own
    (:func:`on_daemon_thread`): on a hard mount whose server is gone it never returns. On a thread of the
    loop's default executor each such call kept the daemon's process from exiting after its stop, and
    took one of the threads the daemon's other work (engine status, evictions, the journal) shares."""
    return on_daemon_thread(fn, *args, name=f"cuzk-fleet-share-{getattr(fn, '__name__', 'call')}")


async def share_within(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the shared folder (:func:`on_share`) for a client's submit, ``what`` it does, waited for
    :data:`.storage_waits.ACCEPT_WAIT_S` at most: past it, Unavailable (exit 3: the client submits again later;
    no job was queued). The call goes on on its thread; a file it leaves (inputs staged or put in place with no
    job naming them) is removed by the prune once stale."""
    try:
        return await wait_shared(on_share(fn, *args), storage_waits.ACCEPT_WAIT_S)
    except TimeoutError:
        raise Unavailable(f"the fleet's shared inputs folder did not answer within {storage_waits.ACCEPT_WAIT_S:g} s "
                          f"while {what} (its storage hangs?); no job was queued: submit again later") from None
