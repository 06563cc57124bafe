"""A TCP forwarder, run as its own process: ``python tcp_forward.py HOST PORT TARGET_HOST TARGET_PORT``.

The fleet tests put one in a network namespace of their own, between a box and the database, to
cut the link and to stand for a database host that rebooted (the forwarder killed while the link is
down, so its connections end without the box hearing of it, and started again). It prints ``ready
PORT`` once it listens (PORT 0 asks for a free port).
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def main(host: str, port: int, target_host: str, target_port: int) -> None:
    """Forward every connection to ``host:port`` to ``target_host:target_port`` until killed."""
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        await asyncio.gather(_pipe(reader, target_writer), _pipe(target_reader, writer))

    server = await asyncio.start_server(forward, host, port)
    print("ready", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
