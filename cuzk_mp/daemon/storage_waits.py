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

No thread can be stopped in a read that hangs, so the call goes on, and it is remembered
(:class:`StorageWaits`): while it has not returned, a later submit that would wait on the same storage
(the same circuit's key file, the journal) is refused at once rather than left to pile up threads, and
the status document names what does not answer. What the call does once the storage answers again is
undone: a job the engine took then is cancelled; a journal row written then is removed by a removal queued
behind the write on the journal's one thread.
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
    """Calls on storage that outlived :data:`ACCEPT_WAIT_S`, by what they wait on (a name a client may see:
    "the key file of circuit X", "the journal"), with when the oldest began; see the module docstring."""

    def __init__(self) -> None:
        self._stuck: dict[str, list[float]] = {}  # what -> the monotonic start of each call that has not returned

    def check(self, what: str) -> None:
        """Unavailable at once where a call on ``what`` has not returned after outliving its wait."""
        started = self._stuck.get(what)
        if started:
            raise Unavailable(f"the daemon takes no job that needs {what} now: it has not answered for "
                              f"{time.monotonic() - min(started):.0f} s (its storage hangs?); send the job again "
                              "later")

    async def wait(self, call: asyncio.Future[T], what: str, *, began: list[float],
                   on_late: Callable[[asyncio.Future[T]], None] | None = None) -> T:
        """``call``'s outcome, waited for until :data:`ACCEPT_WAIT_S` after it began (``began`` gets its
        ``time.monotonic()`` then: a call in turn behind others on one thread waits for its turn first, as
        long as the call before it has not outlived its own wait). Past it, or where the call waits behind
        one that hangs on ``what``, Unavailable, with ``call`` remembered as stuck on ``what`` until it
        ends and ``on_late(call)`` run when it does (to undo what it did after the submit was refused;
        also where this wait is cancelled)."""
        try:
            while True:
                if began:
                    left = began[0] + ACCEPT_WAIT_S - time.monotonic()
                elif self._stuck.get(what):  # its turn comes after a call that hangs
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
        started = began[0] if began else time.monotonic()
        self._stuck.setdefault(what, []).append(started)
        log.error("%s did not answer within %g s (its storage hangs?): the submit waiting on it is refused, and "
                  "later submits that need it are refused at once until it answers", what, ACCEPT_WAIT_S)
        call.add_done_callback(lambda done: self._ended(what, started, done, on_late))
        raise Unavailable(f"the daemon could not take the job: {what} did not answer within {ACCEPT_WAIT_S:g} s "
                          "(its storage hangs?); no job was taken: send it again later")

    def _ended(self, what: str, started: float, call: asyncio.Future[Any],
               on_late: Callable[[asyncio.Future[Any]], None] | None) -> None:
        starts = self._stuck.get(what, [])
        if started in starts:
            starts.remove(started)
        if not starts:
            self._stuck.pop(what, None)
        log.warning("%s answered after %.0f s; submits that need it are taken again", what,
                    time.monotonic() - started)
        if not call.cancelled():
            call.exception()  # retrieved: the refused submit's caller is gone; no "never retrieved" log
        if on_late is not None:
            on_late(call)

    def report(self) -> list[dict[str, Any]]:
        """What does not answer now, for the status document: ``what``, ``for_s`` (the oldest call's age)
        and ``calls``."""
        now = time.monotonic()
        return [{"what": what, "for_s": round(now - min(starts), 1), "calls": len(starts)}
                for what, starts in sorted(self._stuck.items())]
