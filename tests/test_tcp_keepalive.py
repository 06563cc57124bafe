"""Every TCP connection of the daemon's protocol, at both ends, has keepalive probes: a peer whose host
vanished sends no FIN or RST, and without probes its connection stays open for ever (a client's
await without --timeout, the daemon's slot of max_connections)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from cuzk_mp.daemon.tcp_keepalive import KEEPALIVE_COUNT, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S
from cuzk_mp.daemon.blocking_comm import open_socket
from cuzk_mp.daemon.transport import Address, CommClosedError, StreamComm, connect, listen


def _probes(sock: Any) -> tuple[int, int, int, int]:
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))


WANTED = (True, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT)


def test_both_ends_of_a_tcp_connection_probe_a_silent_peer() -> None:
    async def main() -> tuple[Any, Any, Any]:
        accepted: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def on_comm(comm: StreamComm) -> None:
            accepted.set_result(_probes(comm.writer.get_extra_info("socket")))
            with contextlib.suppress(CommClosedError):
                await comm.read()  # until the client closes

        listener = await listen(Address("tcp", host="127.0.0.1", port=0), on_comm, max_frame_bytes=1 << 20)
        try:
            addr = listener.bound
            comm = await connect(addr, 1 << 20)
            async_client = _probes(comm.writer.get_extra_info("socket"))
            server = await asyncio.wait_for(accepted, 10)
            comm.close()
            sync_sock = await asyncio.to_thread(open_socket, addr, 10.0)
            with sync_sock:
                sync_client = _probes(sync_sock)
            return async_client, sync_client, server
        finally:
            await listener.close()

    async_client, sync_client, server = asyncio.run(main())
    assert async_client == WANTED
    assert sync_client == WANTED
    assert server == WANTED
