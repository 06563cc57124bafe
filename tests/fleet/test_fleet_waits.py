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
