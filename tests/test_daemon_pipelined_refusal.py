"""A request the daemon refuses unread (a frame over its max_frame_bytes) on a connection that carries
other calls: only that call gets the refusal. The calls the daemon read before it get their own
answers (the daemon answers them, then closes); those sent after it, which the daemon never read,
fail at once as lost, saying so, and took no job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import CommClosedError
from cuzk_mp.errors import InputError
from tests.fake_engine import run_daemon
from tests.helpers import wait_until

BIG = [P.PartitionIn("json", b" " * (1 << 20))]  # the test daemon takes frames of 64 KiB
REFUSED = r"frame of \d+ bytes exceeds max_frame_bytes \(65536\)"


def test_async_client_refusal_reaches_only_the_refused_call(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()  # the first call's job waits in the engine
        async with await AsyncClient.connect(addr) as c:
            first = asyncio.ensure_future(c.prove("syn", synthetic_partitions(1, first_seed=3), timeout_s=30))
            await asyncio.to_thread(wait_until, lambda: d.engine.submitted, 30)  # the first job is in the engine
            refused = asyncio.ensure_future(c.submit("syn", BIG))
            after = asyncio.ensure_future(c.status())  # sent behind the refused frame: never read
            with pytest.raises(InputError, match=REFUSED):
                await asyncio.wait_for(refused, 30)
            with pytest.raises(CommClosedError, match=r"connection to the daemon lost: request 3 was not read"):
                await asyncio.wait_for(after, 30)
            with pytest.raises(CommClosedError, match="was not read"):  # a new call is not sent into it
                await asyncio.wait_for(c.metrics(), 30)
            assert not first.done()
            d.engine.gate.set()
            done = await asyncio.wait_for(first, 30)
            assert done.state == "done" and done.partitions[0].public == ["0", "3"]
        assert len(d.engine.submitted) == 1  # nothing else became a job

    run_daemon(tmp_path, body)


def test_blocking_client_refusal_reaches_only_the_refused_call(tmp_path: Path) -> None:
    """The blocking client: a call it stopped waiting for (its deadline passed) is still in flight when
    the refused one is sent; the refused call gets the refusal, and a call after it a clear error that
    it was not read, not a broken pipe."""

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()

        def calls() -> None:
            with Client(addr) as c:
                job = c.submit("syn", synthetic_partitions(1, first_seed=5)).job_id
                with pytest.raises(TimeoutError):
                    c.request(P.AwaitProof(id=0, job_id=job, timeout_s=20), deadline_s=0.3)
                with pytest.raises(InputError, match=REFUSED):
                    c.submit("syn", BIG)
                with pytest.raises(CommClosedError, match=r"connection to the daemon lost: request 4 was not read"):
                    c.status()

        await asyncio.to_thread(calls)
        d.engine.gate.set()
        assert len(d.engine.submitted) == 1

    run_daemon(tmp_path, body)


def test_a_refusal_alone_on_its_connection_is_still_reported(tmp_path: Path) -> None:
    """With nothing else in flight the daemon closes at once, the rest of the request unread: both
    clients report the refusal, not the broken pipe of their write."""

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            with pytest.raises(InputError, match=REFUSED):
                await asyncio.wait_for(c.submit("syn", BIG), 30)

        def blocking() -> None:
            with Client(addr) as c:
                with pytest.raises(InputError, match=REFUSED):
                    c.submit("syn", BIG)

        await asyncio.to_thread(blocking)
        assert not d.engine.submitted

    run_daemon(tmp_path, body)
