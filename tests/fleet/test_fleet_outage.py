"""The fleet across a database outage, on a PostgreSQL server of its own that the test stops
and starts again: a box whose calls kept failing through a 40 s outage answers again within
seconds of the database's return, and a client waiting on a job lives through the outage and
gets the job's result; calls made while the database restarts are answered once it is back,
not after the connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pg_server
import pytest
from fleet_helpers import connect, make_inputs

from cuzk_mp.errors import ResourceError

OUTAGE_S = 40.0  # long enough for a pool's connect backoff of 1, 2, 4 ... s to reach 32 s
BACK_WITHIN_S = 12.0  # the LISTEN link retries every 5 s at most, then the box renews its pool


def _server_binaries() -> pg_server.PgBinaries:
    """The PostgreSQL programs an outage test runs its own server with (skip where the fleet extra or
    the programs are missing)."""
    pytest.importorskip("pgqueuer", reason="the fleet extra is not installed (pip install -e '.[fleet]')")
    bins = pg_server.find_binaries()
    if bins is None:
        pytest.skip("no PostgreSQL server programs (initdb, pg_ctl) here")
    return bins


@pytest.mark.slow
def test_a_box_works_again_soon_after_a_long_outage(tmp_path: Path) -> None:
    bins = _server_binaries()
    [inp] = make_inputs(tmp_path, 1)
    with pg_server.running_server(bins) as server, pg_server.fresh_database(server, "outage") as dsn:

        async def main() -> float:
            a = await connect(dsn, "a")
            ref = await a.submit(None, "x", inp.ref, inp.sha256)
            waiter = asyncio.create_task(a.await_result(ref.job_id, 600))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(pg_server.stop, bins, server)

            async def busy() -> None:  # a daemon's own calls (claims, key loads, scrapes) go on failing
                while True:
                    with contextlib.suppress(ResourceError):
                        await a.status(ref.job_id)
                    await asyncio.sleep(0.1)

            callers = [asyncio.create_task(busy()) for _ in range(6)]
            await asyncio.sleep(OUTAGE_S)  # heartbeats every 0.5 s fail meanwhile
            for c in callers:
                c.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
            with pytest.raises(ResourceError):
                await a.status(ref.job_id)
            assert not waiter.done()
            await asyncio.to_thread(pg_server.start_again, bins, server)
            t0 = time.monotonic()
            while True:
                try:
                    await a.status(ref.job_id)
                    break
                except ResourceError:
                    assert time.monotonic() - t0 < 60
                    await asyncio.sleep(0.2)
            back = time.monotonic() - t0
            b = await connect(dsn, "b")
            assert [j.job_id for j in await b.claim(["x"], 1)] == [ref.job_id]
            await b.complete(ref.job_id, b"r")
            st = await asyncio.wait_for(waiter, 30)  # the client's wait outlived the outage
            assert st.state == "done" and st.result == b"r"
            for f in (a, b):
                await f.close()
            return back

        back = asyncio.run(main())
    assert back < BACK_WITHIN_S, f"the box answered {back:.1f} s after the database was back"


def test_calls_made_during_a_restart_are_answered_once_the_database_is_back(tmp_path: Path) -> None:
    bins = _server_binaries()
    [inp] = make_inputs(tmp_path, 1)
    connect_timeout_s = 5.0
    with pg_server.running_server(bins) as server, pg_server.fresh_database(server, "restart") as dsn:

        async def main() -> list[tuple[float, str]]:
            a = await connect(dsn, "a", connect_timeout_s=connect_timeout_s)
            ref = await a.submit(None, "x", inp.ref, inp.sha256)
            for _ in range(3):  # the pool holds a few idle connections, all dead once the server stops
                await asyncio.gather(*[a.status(ref.job_id) for _ in range(4)])

            async def call() -> tuple[float, str]:  # when it ended, and its error
                try:
                    await a.status(ref.job_id)
                    return time.monotonic(), ""
                except ResourceError as e:
                    return time.monotonic(), str(e)

            await asyncio.to_thread(pg_server.stop, bins, server, "fast")  # a restart, as pg_ctl restart does
            calls = [asyncio.create_task(call()) for _ in range(4)]  # each finds a dead connection
            await asyncio.sleep(0.1)
            await asyncio.to_thread(pg_server.start_again, bins, server)
            back = time.monotonic()
            ended = await asyncio.gather(*calls)
            await a.close()
            return [(end - back, err) for end, err in ended]

        ended = asyncio.run(main())
    assert all(not err and after < 3.0 for after, err in ended), ended


def test_a_box_stopping_while_the_database_is_down_gives_its_jobs_back_in_one_connect_timeout(
        tmp_path: Path) -> None:
    """A box stopping (SIGTERM) during an outage tries to give each running job back to the queue;
    each try waits the connect timeout for the database. Tried one after another, a box with a job per
    GPU took that timeout once per job (80 s for 8 jobs at the default 10 s) on top of its drain, and
    systemd's TimeoutStopSec killed it before its engine stopped. The jobs lapse to other boxes anyway."""
    from fleet_helpers import worker

    from cuzk_mp.daemon.fleet.models import Claimed, JobOutput

    bins = _server_binaries()
    inputs = make_inputs(tmp_path, 4)
    connect_timeout_s = 2.0
    with pg_server.running_server(bins) as server, pg_server.fresh_database(server, "stopping") as dsn:

        async def main() -> float:
            a = await connect(dsn, "a", connect_timeout_s=connect_timeout_s)
            for inp in inputs:
                await a.submit(None, "x", inp.ref, inp.sha256)

            async def run_job(c: Claimed) -> JobOutput:
                await asyncio.sleep(600)
                return JobOutput(b"")

            stop = asyncio.Event()
            w = worker(a, run_job, resident=lambda: ["x"], capacity=lambda: len(inputs))
            running = asyncio.create_task(w.run(stop))
            while len(w.running) < len(inputs):
                await asyncio.sleep(0.05)
            await asyncio.to_thread(pg_server.stop, bins, server)
            t0 = time.monotonic()
            stop.set()
            await running
            took = time.monotonic() - t0
            await asyncio.to_thread(pg_server.start_again, bins, server)
            await a.close()
            return took

        took = asyncio.run(main())
    assert took < 2 * connect_timeout_s, f"the drain took {took:.1f} s"
