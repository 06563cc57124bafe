"""State that must stay bounded over a long run: a client connection kept open for months holds
no record of the requests it gave up on."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import FrameTooLarge
from tests.fake_engine import run_daemon


def test_client_forgets_requests_it_gave_up_on(tmp_path: Path) -> None:
    """A request that could not be sent (larger than the client's frame limit) or whose caller
    stopped waiting leaves nothing in the connection's pending table: one long-lived connection
    that keeps meeting either would otherwise grow by a future per request."""

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr, max_frame_bytes=4096) as c:
            big = [P.PartitionIn(kind="wtns", data=b"\0" * 8192)]
            for _ in range(500):
                with pytest.raises(FrameTooLarge):
                    await c.submit("syn", big)
            d.engine.gate.clear()  # the job stays queued: every wait below is given up
            sub = await c.submit("syn", synthetic_partitions(1), request_id="held")
            for _ in range(200):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c.await_proof(sub.job_id), 0.001)
            assert len(c._pending) == 0
            d.engine.gate.set()
            assert (await c.await_proof(sub.job_id, timeout_s=10)).state == "done"  # the connection still works
            assert len(c._pending) == 0

    run_daemon(tmp_path, body)
