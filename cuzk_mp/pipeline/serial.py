"""One daemon thread that runs the calls given to it one at a time, in the order given.

For calls that must keep their order and may never return: the daemon's journal writes (an fsync on a
folder whose storage hangs), the engine's reads of a key file after a job's last proof (a key on a hard
NFS mount whose server went away). A ``ThreadPoolExecutor``'s thread is joined at interpreter exit, for
ever where its call never returns; this thread is a daemon thread, and :meth:`SerialThread.close` waits
for the calls given so far only as long as it is told. ``running_since`` tells how long the running call
has run: one that hangs holds every call behind it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable


class SerialThread:
    """A single-worker executor on a daemon thread (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.running_since: float | None = None  # time.monotonic() at which the running call began; None: idle
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the thread once the calls given before it have ended; ``fn`` handles its own errors
        and hands its outcome over itself."""
        self._calls.put(fn)

    def close(self, wait_s: float | None = None) -> bool:
        """No more calls; wait up to ``wait_s`` (None: no limit) for those given to end. Whether they did:
        False leaves the thread stuck in one of them."""
        self._calls.put(None)
        self._thread.join(wait_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            self.running_since = time.monotonic()
            try:
                call()
            finally:
                self.running_since = None
