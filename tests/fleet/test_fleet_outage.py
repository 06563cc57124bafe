"""The fleet across a database outage, on a PostgreSQL server of its own that the test stops
and starts again: a box whose calls kept failing through an outage long enough for its pool's waits
between connection attempts to outgrow the wait the test allows answers again within seconds of the
database's return, and a client waiting on a job lives through the outage and
gets the job's result; calls made while the database restarts are answered once it is back,
not after the connect timeout. Where network namespaces can be made: a link that dies silently is
noticed by the box, and by the server, which frees what the box's transaction held within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pg_server
import pytest
from fleet_helpers import connect, make_inputs

from cuzk_mp.errors import ResourceError

# The box's LISTEN link retries every RECONNECT_MAX_S at most (its default is 5 s), then the box renews its
# pool: it answers within BACK_WITHIN_S, on the new pool. The old pool's own attempts, 1, 2, 4, 8, 16 s
# apart, had grown to 8 s apart by the end of an outage of OUTAGE_S and answered anywhere from 2 to 29 s
# after the database's return in earlier runs (20 and 40 s outages), so whether the box renewed its pool
# is asserted as such, not only by how soon it answered.
RECONNECT_MAX_S = 0.5
OUTAGE_S = 10.0
BACK_WITHIN_S = 6.0
CONNECT_TIMEOUT_S = 3.0  # how long the call that finds the database still away at the outage's end waits


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
            a = await connect(dsn, "a", reconnect_max_s=RECONNECT_MAX_S, connect_timeout_s=CONNECT_TIMEOUT_S)
            pool = a._pool
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
            assert a._pool is not pool, "the box answered on the pool of before the outage"
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


FORWARD = Path(__file__).with_name("tcp_forward.py")
LINK_SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # private; each link takes a /30 of it, none in use
LINK_NAME = re.compile(r"cz(\d+)x\d+(?:ns|o)")  # a link's namespace and outer end: cz<pid>x<n>ns, cz<pid>x<n>o
_link_numbers = itertools.count()


def _ip(*args: str, check: bool = True) -> str:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True).stdout


class _Link:
    """The box's way to the database through a network namespace of its own (the database host, as
    the box sees it): a veth pair, a :mod:`tcp_forward` process in the namespace, and one beside the
    database. The test cuts the link, or restarts that host, without the box hearing of it, as a
    failed switch or a database host that loses power does.

    Its names hold this process's id and a number, its addresses a /30 of :data:`LINK_SUBNETS` that no
    interface has, so that runs at once (two checkouts; CI beside a developer's run) and the links of
    one run never meet; what a run killed before its cleanup left is removed first (:func:`_remove_leftovers`).
    """

    def __init__(self, tag: str) -> None:
        self.ns, self.outer, self.inner = f"{tag}ns", f"{tag}o", f"{tag}i"
        self.procs: list[subprocess.Popen[str]] = []
        self.beside_db = 0
        _remove_leftovers()
        subnet = _free_subnet()
        self.outer_ip, self.inner_ip = str(subnet[1]), str(subnet[2])
        self.prefix = subnet.prefixlen

    def start(self, db_port: int) -> None:
        self._make_link()
        self.beside_db = self._forward([], self.outer_ip, 0, "127.0.0.1", db_port)  # stays procs[0]
        self._forward(["ip", "netns", "exec", self.ns], self.inner_ip, 5432, self.outer_ip, self.beside_db)

    def close(self) -> None:
        """Remove it all (again, if done before): a call still waiting on the link ends, its host gone."""
        self._remove_host()
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs.clear()

    def _forward(self, prefix: list[str], host: str, port: int, to_host: str, to_port: int) -> int:
        proc = subprocess.Popen([*prefix, sys.executable, str(FORWARD), host, str(port), to_host, str(to_port)],
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        word, listening = proc.stdout.readline().split()
        assert word == "ready", word
        return int(listening)

    def _make_link(self) -> None:
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _ip("link", "set", self.inner, "netns", self.ns)
        _ip("addr", "add", f"{self.outer_ip}/{self.prefix}", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        _ip("netns", "exec", self.ns, "ip", "addr", "add", f"{self.inner_ip}/{self.prefix}", "dev", self.inner)
        _ip("netns", "exec", self.ns, "ip", "link", "set", self.inner, "up")

    def _remove_host(self) -> None:
        """Remove the host, its link and whatever it knew of its connections."""
        for proc in self.procs[1:]:
            proc.kill()
            proc.wait()
        del self.procs[1:]
        _ip("link", "del", self.outer, check=False)
        _ip("netns", "del", self.ns, check=False)

    def cut(self) -> None:
        """Packets stop crossing; no end is told."""
        _ip("netns", "exec", self.ns, "ip", "link", "set", self.inner, "down")

    def restart_host(self) -> None:
        """The host (cut off meanwhile) comes back knowing nothing of the connections it had: the
        box's side of each stays open, silent."""
        self._remove_host()
        self._make_link()
        self._forward(["ip", "netns", "exec", self.ns], self.inner_ip, 5432, self.outer_ip, self.beside_db)


def _remove_leftovers() -> None:
    """Remove the namespaces and outer links of runs that died before their cleanup (their process
    is gone): an interface name or an address left behind would clash with a later run's."""
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()]
    for name in names:
        m = LINK_NAME.fullmatch(name)
        if m is None or _alive(int(m[1])):
            continue
        if name.endswith("ns"):
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)  # its peer goes with it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of :data:`LINK_SUBNETS` that no interface here has an address in, the first one tried chosen
    by this process's id (runs at once start apart)."""
    used = [ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", _ip("-4", "-o", "addr", "show"))]
    subnets = list(LINK_SUBNETS.subnets(new_prefix=30))
    start = os.getpid() * 4 + next(_link_numbers)
    for i in range(len(subnets)):
        subnet = subnets[(start + i) % len(subnets)]
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError(f"every /30 of {LINK_SUBNETS} is in use")


def _netns_tag() -> str:
    """A tag for a new network namespace and links of this process; skips where none can be made."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("cutting a link needs root and the ip program (network namespaces)")
    tag = f"cz{os.getpid()}x{next(_link_numbers)}"
    probe = subprocess.run(["ip", "netns", "add", f"{tag}ns"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespaces here: {probe.stderr.strip()}")
    _ip("netns", "del", f"{tag}ns")
    return tag


@contextlib.contextmanager
def _cuttable_link(db_port: int) -> Iterator[tuple[str, _Link]]:
    """``(host:port the box connects to, the link)``; skips where network namespaces cannot be made."""
    link = _Link(_netns_tag())
    try:
        link.start(db_port)
        yield f"{link.inner_ip}:5432", link
    finally:
        link.close()


def test_links_made_at_once_and_after_a_dead_run_each_lead_to_their_own_end() -> None:
    """Two links made at once (two test runs on one machine, or two tests of one run) each lead to
    their own database, and what a run killed before its cleanup left (a namespace, a link holding an
    address of the range) is removed rather than clash. With one fixed address and name per run, a
    second run's box reached the first run's database, or none."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    left_ns, left_link = f"cz{dead.pid}x0ns", f"cz{dead.pid}x0o"
    tag = _netns_tag()
    _ip("netns", "add", left_ns)
    _ip("link", "add", left_link, "type", "veth", "peer", "name", f"cz{dead.pid}x0i")
    _ip("addr", "add", f"{LINK_SUBNETS[1]}/30", "dev", left_link)
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    links = [_Link(tag), _Link(_netns_tag())]
    try:
        for link, server in zip(links, servers, strict=True):
            link.start(server.getsockname()[1])
        assert left_ns not in _ip("netns", "list") and left_link not in _ip("-o", "link", "show")
        for i, (link, server) in enumerate(zip(links, servers, strict=True)):
            _wait_reachable(link.inner_ip, 5432)
            server.accept()[0].close()  # the probe's connection
            with socket.create_connection((link.inner_ip, 5432), timeout=5) as c:
                conn, _ = server.accept()
                conn.sendall(b"%d" % i)
                assert c.recv(1) == b"%d" % i
                conn.close()
    finally:
        for link in links:
            link.close()
        for server in servers:
            server.close()
        _ip("netns", "del", left_ns, check=False)
        _ip("link", "del", left_link, check=False)


def test_a_box_notices_a_database_link_that_died_silently(fleet_dsn: str, tmp_path: Path) -> None:
    """The link to the database fails without a word to the box (a switch dies; the database host
    loses power and comes back). Through the cut, a call fails within about the connect timeout
    instead of waiting for TCP to give up (15 minutes); once the host is back, the box's LISTEN
    connection, idle and so never told that its host forgot it, is found dead and opened again: a
    client waiting on a job hears of its end at once, not at the 60 s safety-net read."""
    from cuzk_mp.daemon.fleet.submits import AWAIT_RECHECK_S

    [inp] = make_inputs(tmp_path, 1)
    host_port = fleet_dsn.split("@", 1)[1].split("/", 1)[0]
    with _cuttable_link(int(host_port.rsplit(":", 1)[1])) as (via, link):

        async def main() -> tuple[float, float]:
            direct = await connect(fleet_dsn, "direct")
            a = await connect(fleet_dsn.replace(host_port, via), "a", connect_timeout_s=2.0)
            try:
                ref = await direct.submit(None, "x", inp.ref, inp.sha256)
                await asyncio.gather(*[a.status(ref.job_id) for _ in range(4)])
                link.cut()
                t0 = time.monotonic()
                with pytest.raises(ResourceError):
                    await asyncio.wait_for(a.status(ref.job_id), 30)
                failed_after = time.monotonic() - t0
                link.restart_host()
                waiter = asyncio.create_task(a.await_result(ref.job_id, 2 * AWAIT_RECHECK_S))
                [c] = await direct.claim(["x"], 1)
                assert await direct.complete(c.job_id, b"proof")
                t0 = time.monotonic()
                st = await asyncio.wait_for(waiter, AWAIT_RECHECK_S / 2)
                heard_after = time.monotonic() - t0
                assert (st.state, st.result) == ("done", b"proof")
                return failed_after, heard_after
            finally:
                link.close()
                for f in (a, direct):
                    await f.close()

        failed_after, heard_after = asyncio.run(main())
    assert failed_after < 10 and heard_after < 15, (failed_after, heard_after)


def _wait_reachable(host: str, port: int, timeout_s: float = 10.0) -> None:
    """Until a TCP connection to ``host:port`` opens (a link just made may drop the first packets)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{host}:{port} unreachable for {timeout_s} s"
            time.sleep(0.1)


def test_the_server_frees_the_locks_of_a_box_whose_link_died_silently(tmp_path: Path) -> None:
    """A box's link dies without a word while the box is inside a transaction holding a claimed job's
    rows. The server, in a network namespace of its own at the link's other end, gives up on the box's
    connection after the box's connect timeout and a keepalive probe or so, well before the box's stall
    timeout (its idle-in-transaction timeout), and frees the rows: a cancel from another box waits
    seconds. With the operating system's keepalive defaults the server kept them for 2 hours."""
    bins = _server_binaries()
    [inp] = make_inputs(tmp_path, 1)
    link = _Link(_netns_tag())
    try:
        link._make_link()
        with pg_server.running_server(bins, host=link.inner_ip, netns=link.ns) as server, \
                pg_server.fresh_database(server, "silent") as dsn:

            _wait_reachable(server.host, server.port)

            async def main() -> float:
                s = await connect(server.socket_dsn("silent"), "s")
                cut = await connect(dsn, "cut", connect_timeout_s=2.0)  # the stall timeout stays 30 s
                try:
                    ref = await s.submit(None, "x", inp.ref, inp.sha256)
                    [c] = await cut.claim(["x"], 1)
                    with contextlib.suppress(ResourceError):  # the end of the transaction finds the link dead
                        async with cut._tx() as (conn, _):
                            await cut._lock_queue_row(conn, c.job_id)
                            await conn.execute("SELECT 1 FROM cuzk_fleet_jobs WHERE job_id = %s FOR UPDATE",
                                               (c.job_id,))
                            link.cut()
                            t0 = time.monotonic()
                            cancelled = await asyncio.wait_for(s.cancel(ref.job_id), 25)
                            took = time.monotonic() - t0
                    assert cancelled
                    return took
                finally:
                    for f in (s, cut):
                        await asyncio.wait_for(f.close(), 30)

            took = asyncio.run(main())
    finally:
        link.close()
    assert took < 15, f"the cut-off box's locks were freed {took:.1f} s after the cut"
