"""A client pointed at another service's port (an SSH, SMTP or Redis server, a TLS endpoint) is told it did not
reach a cuzk-mp daemon, and its command exits 3 (unreachable), not 2 with "frame of 1397966893 bytes exceeds
max_frame_bytes": the four bytes where a reply's length was expected are that server's words. A daemon's reply
over the client's own limit is still refused as too large."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuzk_mp import cli
from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions
from cuzk_mp.daemon.prove_files import Unreachable, prove_to_files
from cuzk_mp.daemon.transport import FrameTooLarge, NotTheProtocol

SSH = b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"


class ForeignServer:
    """A TCP server on 127.0.0.1 that answers every connection as another service would: ``greeting`` sent on
    connect, or ``answer`` sent once the client's first bytes arrive; then it holds the connection open."""

    def __init__(self, greeting: bytes = b"", answer: bytes = b"") -> None:
        self.greeting, self.answer = greeting, answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            if self.greeting:
                conn.sendall(self.greeting)
            if self.answer and conn.recv(1 << 16):
                conn.sendall(self.answer)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ForeignServer]:
    s = ForeignServer(**request.param)
    yield s
    s.close()


FOREIGN = [
    pytest.param({"greeting": SSH}, "it sent 'SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13'", id="ssh"),
    pytest.param({"greeting": b"220 mail.example.org ESMTP Postfix\r\n"}, "it sent '220 mail.example.org ESMTP",
                 id="smtp"),
    pytest.param({"answer": b"-ERR unknown command\r\n"}, "it sent '-ERR unknown command'", id="redis"),
    pytest.param({"answer": b"\x15\x03\x03\x00\x02\x02\x32"}, "it answers TLS", id="tls"),
]


@pytest.mark.parametrize(("server", "said"), FOREIGN, indirect=["server"])
def test_a_client_at_another_services_port_is_told_so_and_exits_3(
        server: ForeignServer, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    addr = server.address
    with pytest.raises(NotTheProtocol, match=said):
        with Client(addr, connect_timeout=10) as c:
            c.status()

    async def asynchronous() -> None:
        async with await AsyncClient.connect(addr) as ac:
            await asyncio.wait_for(ac.status(), 10)

    with pytest.raises(NotTheProtocol, match=said):
        asyncio.run(asynchronous())
    with pytest.raises(Unreachable, match=f"cannot reach the daemon at {addr}: .*{said}"):
        prove_to_files(addr, "", "syn", tmp_path / "k.zkey", tmp_path / "w.wtns", synthetic_partitions(1)[0],
                       tmp_path / "p.json", tmp_path / "q.json")
    assert not (tmp_path / "p.json").exists()

    capsys.readouterr()
    assert cli.main(["client", "status", "--connect", addr]) == cli.EXIT_UNREACHABLE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"cuzk-mp client: cannot reach the daemon at {addr}: ")
    assert said in line and "frame of" not in line


def test_a_daemons_reply_over_the_clients_limit_is_still_too_large() -> None:
    """A length whose bytes are not text is a daemon's: a reply over the client's max_frame_bytes, refused as
    such (the client's --max-frame-bytes is what to raise), not taken for another service."""
    length = struct.pack(">I", 5 << 20)
    server = ForeignServer(answer=length + b"\x82\xa4" + b"\0" * 64)
    try:
        with pytest.raises(FrameTooLarge, match=r"frame of 5242880 bytes exceeds max_frame_bytes \(1048576\)"):
            with Client(server.address, max_frame_bytes=1 << 20, connect_timeout=10) as c:
                c.status()

        async def asynchronous() -> None:
            async with await AsyncClient.connect(server.address, max_frame_bytes=1 << 20) as ac:
                await asyncio.wait_for(ac.status(), 10)

        with pytest.raises(FrameTooLarge, match="exceeds max_frame_bytes"):
            asyncio.run(asynchronous())
    finally:
        server.close()


def test_a_port_that_takes_the_connection_and_says_nothing_is_named_after_the_deadline(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A port that accepts and never answers (a hung daemon, a black hole): the call ends at its deadline with
    exit 3 saying the daemon did not answer, not "lost the daemon: timed out"."""
    from cuzk_mp.daemon import client as client_module

    monkeypatch.setattr(client_module, "DEADLINE_MARGIN_S", 0.5)
    server = ForeignServer()
    try:
        assert cli.main(["client", "status", "--connect", server.address]) == cli.EXIT_UNREACHABLE
    finally:
        server.close()
    [line] = capsys.readouterr().err.splitlines()
    assert line == (f"cuzk-mp client: the daemon at {server.address} did not answer within the call's deadline (it "
                    "hangs, or that address takes connections and says nothing)")
