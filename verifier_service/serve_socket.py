"""The verifier's Serve socket (specd/serve_socket.py): Serve streams as frames on plain TCP connections, beside gRPC
Serve, each run by the same function as gRPC Serve's (service.py's `serve`), so starts, aborts, refusals, deadlines
and drain behave alike; a stream that ends at once (the model still loading) closes its connection. A gateway that
closes its side, or whose connection breaks, has its requests aborted."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from specd.serve_socket import frame, frames, server_ssl
from specd.serving import TlsConfig
from specd.startup_errors import bound_socket
from specd.v1 import verifier_pb2

logger = logging.getLogger(__name__)

Serve = Callable[[AsyncIterator[verifier_pb2.ServeRequest]], AsyncIterator[verifier_pb2.ServeResponse]]


class ServeSocket:
    """Listens for gateways and runs `serve` over each connection; `close()` ends the listening socket and every
    connection (a verifier going away: the gateways see their streams break, as when its process ends, and resume
    the requests elsewhere)."""

    def __init__(self, serve: Serve) -> None:
        self._serve = serve
        self._server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, host: str, port: int, tls: TlsConfig | None) -> "ServeSocket":
        """Listens on host:port (0: a free port, then `port` says which); PortInUse naming --serve-port when it is
        taken."""
        self._server = await asyncio.start_server(self._serve_connection, sock=bound_socket(host, port, "serve-port"),
                                                  ssl=server_ssl(tls))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self.connections:
            writer.transport.abort()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        gone = asyncio.get_running_loop().create_future()  # the gateway closed its side or the connection broke
        sending = asyncio.ensure_future(
            _send(self._serve(_until_closed(frames(reader, verifier_pb2.ServeRequest), gone)), writer))
        try:
            await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done():
                sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sending
        finally:
            self.connections.discard(writer)
            writer.close()


async def _until_closed(messages, gone: asyncio.Future):
    """The connection's messages; `gone` is set when they end, whether the peer closed cleanly or not."""
    try:
        async for message in messages:
            yield message
    except (ConnectionError, asyncio.IncompleteReadError) as error:
        logger.info("Serve socket connection broke: %s", error)
    finally:
        if not gone.done():
            gone.set_result(None)


async def _send(responses, writer: asyncio.StreamWriter) -> None:
    try:
        async for response in responses:
            writer.write(frame(response))
            await writer.drain()  # waits only while the gateway reads slower than steps come
    finally:
        await responses.aclose()
