"""The listening socket ``omniqueue api`` shares with other API processes
(``OMNIQ_HTTP__REUSE_PORT``): its accepted connections have Nagle off, as asyncio gives
the connections of a socket it binds itself."""

from __future__ import annotations

import asyncio
import socket

from cli.main import _shared_socket
from workers.runtime.processes import free_port


def _server_side_nodelay(listener: socket.socket) -> int:
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def test_connections_of_the_shared_socket_have_nagle_off() -> None:
    assert _server_side_nodelay(_shared_socket("127.0.0.1", free_port())) != 0


def test_a_socket_made_without_the_tcp_proto_would_keep_nagle_on() -> None:
    """Why ``_shared_socket`` passes the proto: asyncio looks at it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", free_port()))
    assert _server_side_nodelay(sock) == 0
