"""The gateway's HTTP connections send each small write at once (TCP_NODELAY): a streamed response's events must not
wait for the client's delayed ACK (about 40 ms) on a keep-alive connection, as they did when the listening socket
was created without naming TCP and asyncio therefore left Nagle's algorithm on."""
import asyncio
import socket

from bench.local_stack import free_port
from specd.startup_errors import bound_socket


def test_connections_accepted_on_the_bound_socket_have_nagle_off():
    async def main() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connection(reader, writer) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = bound_socket("127.0.0.1", free_port(), "http-port", reuse_port=True)
        server = await asyncio.start_server(on_connection, sock=sock)  # as uvicorn serves the gateway's socket
        try:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            nodelay = await asyncio.wait_for(accepted, 10)
            writer.close()
            return nodelay
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) != 0
