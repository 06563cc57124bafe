"""A daemon out of file descriptors (many clients at once, a low ``LimitNOFILE``), against an
in-process daemon (the protocol tests' engine double): its listener backs off and says so once,
the connections it has go on, and the clients that waited are served once descriptors are free."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import struct
from pathlib import Path

import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import frame
from tests.fake_engine import run_daemon

WAITING = 30  # clients that connect while the daemon has no descriptor to accept them with


def _status_on(sock: socket.socket) -> P.Reply:
    """Send GetStatus on a connected socket and read the reply (blocking)."""
    sock.settimeout(10)
    sock.sendall(frame(P.encode(P.GetStatus(id=7))))
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
        chunk = sock.recv(1 << 16)
        assert chunk, "the daemon closed the connection"
        buf += chunk
    return P.decode_reply(buf[4:])


def test_out_of_descriptors_the_listener_backs_off_and_serves_again(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """accept() failing with EMFILE: one warning naming the limit (not an error with a traceback for
    every try, ever more of them while it lasts), the connected client's job goes on to its result,
    and once descriptors are free the clients that waited in the listen backlog are served."""
    caplog.set_level(logging.WARNING)
    waiting = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(WAITING)]  # descriptors taken now

    async def body(d: Daemon, addr: str) -> None:
        path = addr[len("unix://"):]
        async with await AsyncClient.connect(addr) as c:
            d.engine.gate.clear()
            job = (await c.submit("syn", synthetic_partitions(1))).job_id
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
            fillers: list[int] = []
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (top + 3, hard))
                with contextlib.suppress(OSError):  # every descriptor taken (EMFILE) ...
                    while True:
                        fillers.append(os.open(os.devnull, os.O_RDONLY))
                for fd in fillers[-2:]:  # ... but two: the daemon accepts two clients, then runs out
                    os.close(fd)
                del fillers[-2:]
                for s in waiting:
                    s.connect(path)  # they wait in the listen backlog once the daemon cannot accept
                await asyncio.sleep(1.5)
                d.engine.gate.set()
                assert (await c.await_proof(job, timeout_s=10)).state == "done"
            finally:
                for fd in fillers:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for s in waiting:  # one at a time: the daemon's status takes a worker thread too
                reply = await asyncio.to_thread(_status_on, s)
                assert isinstance(reply, P.StatusReply) and reply.id == 7, reply
                s.close()
        async with await AsyncClient.connect(addr) as c:
            assert (await c.prove("syn", synthetic_partitions(1), timeout_s=10)).state == "done"

    try:
        run_daemon(tmp_path, body)
    finally:
        for s in waiting:
            s.close()
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in shown if r.exc_info], [r.getMessage() for r in shown if r.exc_info][:1]
    out_of = [r.getMessage() for r in shown if "no file descriptor left" in r.getMessage()]
    assert len(out_of) == 1, [r.getMessage() for r in shown][:5]
    assert "LimitNOFILE" in out_of[0] and "ulimit -n" in out_of[0], out_of[0]
