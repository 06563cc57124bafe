"""Waits of a box that must end when they are cancelled, whatever else happens in that moment."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet_helpers import connect, make_inputs


def test_a_waiter_cancelled_as_its_job_is_announced_ends(fleet_dsn: str, tmp_path: Path) -> None:
    """A client's wait for a job (no timeout) is cancelled (the client went away, the daemon stops) in
    the very moment a notification about the job wakes it: the wait ends, cancelled, rather than read
    the job again and wait on for a caller that is gone."""
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256)
        waiting = asyncio.create_task(a.await_result(ref.job_id, None))
        for _ in range(100):  # until it has read the job and waits to hear of it
            await asyncio.sleep(0.05)
            if ref.job_id in a._waiters and not waiting.done():
                break
        await asyncio.sleep(0.3)
        a._wake_waiters(ref.job_id)
        waiting.cancel()
        done, _ = await asyncio.wait({waiting}, timeout=10)
        assert done and waiting.cancelled(), "the wait went on after its cancel"
        await a.close()

    asyncio.run(main())


def test_a_call_on_a_daemon_thread_hands_its_outcome_to_the_loop() -> None:
    """``on_daemon_thread`` is ``asyncio.to_thread`` on a thread exit does not join: its result or its
    error comes back to the awaiting coroutine, and one given up on that ends after the loop closed is
    dropped without an error."""
    import threading

    import pytest

    from cuzk_mp.daemon.threads import on_daemon_thread

    def boom() -> None:
        raise OSError("the key file cannot be read")

    ran_on: list[threading.Thread] = []
    late = threading.Event()

    def returns_late() -> str:
        late.wait(10)
        return "too late"

    async def main() -> None:
        def record(x: int) -> int:
            ran_on.append(threading.current_thread())
            return x + 1

        assert await on_daemon_thread(record, 41, name="cuzk-test-call") == 42
        with pytest.raises(OSError, match="cannot be read"):
            await on_daemon_thread(boom, name="cuzk-test-error")
        on_daemon_thread(returns_late, name="cuzk-test-late")  # given up on: the loop ends first

    asyncio.run(main())
    [thread] = ran_on
    assert thread.daemon and thread.name == "cuzk-test-call" and thread is not threading.main_thread()
    late.set()
    for t in threading.enumerate():
        if t.name == "cuzk-test-late":
            t.join(10)
            assert not t.is_alive()
