"""A submit's calls on storage that may hang, each waited for a bounded time.

A submit hands its job to the engine, which reads the circuit's key file's header as it takes the job,
then writes the job to the journal. On a hard NFS mount whose server is gone that read, or the journal's
fsync, never returns: the client's submit waited for ever, and its job held a place under the queue caps
(``max_queued_jobs``, ``max_jobs_per_owner``) for ever. Each such call is waited for
:data:`ACCEPT_WAIT_S` at most; then the submit is refused with Unavailable (exit 3: the client sends it
again later, under the same request_id, and no job was taken) and its places are freed.

The wait counts from when the call begins: calls on one thread (a circuit's hand-overs to the engine,
the journal's writes) keep their order, and a call in turn behind a slow but working one (a large input
JSON being validated) is not refused for the time its turn took; one in turn behind a call that hangs is.

No thread can be stopped in a read that hangs, so the call goes on. While a call on one of those threads
has run longer than the wait (a submit's, or another: the journal's write of a finished job), a submit that
would wait on the same storage (the same circuit's key file, the journal) is refused at once rather than
left to queue behind it, and the status document (and, for the journal, ``/healthz``) names what does not
answer. What a refused submit's call does once the storage answers again is undone: a job the engine took
then is cancelled; a journal row written then is removed by a removal queued behind the write on the
journal's one thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from cuzk_mp.daemon.threads import wait_shared
from cuzk_mp.errors import Unavailable

log = logging.getLogger("cuzk_mp.daemon.storage_waits")
T = TypeVar("T")

# How long a submit waits for the key file's header or the journal's write. On a working disk they take
# milliseconds; a cold network file system may take seconds.
ACCEPT_WAIT_S = 60.0
TURN_CHECK_S = 1.0  # how often a call not yet begun (in turn behind others) looks whether the one before it hangs


class StorageWaits:
    """What a submit waits on (a name a client may see: "the key file of circuit X", "the journal"), each
    with the thread its calls run on one at a time (:meth:`watch`: when that thread's running call
    began); see the module docstring."""

    def __init__(self) -> None:
        self._busy_since: dict[str, Callable[[], float | None]] = {}

    def watch(self, what: str, busy_since: Callable[[], float | None]) -> None:
        """Calls that need ``what`` run one at a time on a thread whose running call began at
        ``busy_since()`` (``time.monotonic()``; None while it is idle)."""
        self._busy_since[what] = busy_since

    def hung_for(self, what: str) -> float | None:
        """How long the call running on ``what``'s thread has run, where that is past :data:`ACCEPT_WAIT_S`
        (it hangs, and every call behind it waits); else None."""
        since = self._busy_since[what]() if what in self._busy_since else None
        if since is None or time.monotonic() - since < ACCEPT_WAIT_S:
            return None
        return time.monotonic() - since

    def check(self, what: str) -> None:
        """Unavailable at once where a call on ``what`` hangs (:meth:`hung_for`)."""
        hung = self.hung_for(what)
        if hung is not None:
            raise Unavailable(f"the daemon takes no job that needs {what} now: it has not answered for "
                              f"{hung:.0f} s (its storage hangs?); send the job again later")

    async def wait(self, call: asyncio.Future[T], what: str, *, began: list[float],
                   on_late: Callable[[asyncio.Future[T]], None] | None = None) -> T:
        """``call``'s outcome, waited for until :data:`ACCEPT_WAIT_S` after it began (``began`` gets its
        ``time.monotonic()`` then: a call in turn behind others on ``what``'s thread waits for its turn
        first, as long as the call before it does not hang). Past it, or where its turn comes after a call
        that hangs, TimeoutError saying so, and ``on_late(call)`` run once the call ends (to undo what it
        did after its waiter gave it up; also where this wait is cancelled)."""
        try:
            while True:
                if began:
                    left = began[0] + ACCEPT_WAIT_S - time.monotonic()
                elif self.hung_for(what) is not None:  # its turn comes after a call that hangs
                    break
                else:
                    left = TURN_CHECK_S
                try:
                    return await wait_shared(call, max(left, 0.0))
                except TimeoutError:
                    if began and began[0] + ACCEPT_WAIT_S <= time.monotonic():
                        break
        except asyncio.CancelledError:  # the submit's caller is gone: what the call does still needs undoing
            if on_late is not None and not call.done():
                call.add_done_callback(on_late)
            raise
        given_up = time.monotonic()
        call.add_done_callback(lambda done: _ended(what, given_up, done, on_late))
        raise TimeoutError(f"{what} did not answer within {ACCEPT_WAIT_S:g} s (its storage hangs?)")

    def report(self) -> list[dict[str, Any]]:
        """What does not answer now, for the status document: ``what`` and ``for_s``."""
        hung = {what: self.hung_for(what) for what in self._busy_since}
        return [{"what": what, "for_s": round(for_s, 1)} for what, for_s in sorted(hung.items()) if for_s is not None]


def refusal(e: TimeoutError) -> Unavailable:
    """The submit's answer where :meth:`StorageWaits.wait` gave its call up (logged: later submits that need
    the same storage are refused at once until it answers)."""
    log.error("%s: the submit waiting on it is refused, and later submits that need it are refused at once "
              "until it answers", e)
    return Unavailable(f"the daemon could not take the job: {e}; no job was taken: send it again later")


def _ended(what: str, given_up: float, call: asyncio.Future[Any],
           on_late: Callable[[asyncio.Future[Any]], None] | None) -> None:
    """A call whose wait was given up ended: logged, its outcome retrieved, what it did undone."""
    log.warning("%s answered %.0f s after a wait for it was given up", what, time.monotonic() - given_up)
    if not call.cancelled():
        call.exception()  # retrieved: the refused submit's caller is gone; no "never retrieved" log
    if on_late is not None:
        on_late(call)
