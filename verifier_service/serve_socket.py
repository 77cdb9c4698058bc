"""The verifier's Serve socket (specd/serve_socket.py): Serve streams as frames on plain TCP connections, beside gRPC
Serve, with the same ServeStream behind each (service.py's `serve`), so starts, aborts, refusals, deadlines and drain
behave alike. A connection that arrives while the model loads is closed at once, as gRPC Serve answers UNAVAILABLE
then; a gateway that closes its side, or whose connection breaks, has its requests aborted."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from specd.serve_socket import frame, frames, server_ssl
from specd.serving import TlsConfig
from specd.startup_errors import bound_socket
from specd.v1 import verifier_pb2
from verifier_service.service import VerifierServicer

logger = logging.getLogger(__name__)


class ServeSocket:
    """The listening socket and its connections; `close()` ends both (a verifier going away: the gateways see their
    streams break, as when its process ends, and resume the requests elsewhere)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.connections:
            writer.transport.abort()


async def start_serve_socket(servicer: VerifierServicer, host: str, port: int, tls: TlsConfig | None) -> ServeSocket:
    """Listens on host:port (0: a free port), recorded as `servicer.serve_port` for the load reports; PortInUse
    naming --serve-port when it is taken."""
    serve_socket = ServeSocket()
    serve_socket.server = await asyncio.start_server(
        lambda reader, writer: _serve_connection(servicer, reader, writer, serve_socket.connections),
        sock=bound_socket(host, port, "serve-port"), ssl=server_ssl(tls))
    servicer.serve_port = serve_socket.server.sockets[0].getsockname()[1]
    return serve_socket


async def _serve_connection(servicer: VerifierServicer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            connections: set[asyncio.StreamWriter]) -> None:
    connections.add(writer)
    try:
        if not servicer.attached:
            return
        gone = asyncio.get_running_loop().create_future()  # the gateway closed its side or the connection broke
        responses = servicer.serve(_until_closed(frames(reader, verifier_pb2.ServeRequest), gone))
        sending = asyncio.ensure_future(_send(responses, writer))
        await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not sending.done():
            sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
    except ConnectionError as error:
        logger.info("Serve socket connection ended: %s", error)
    finally:
        connections.discard(writer)
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
