"""The gateway's end of a verifier's Serve socket (specd/serve_socket.py): a Serve call with grpc.aio's interface as
verifier_stream.py uses it (`write`, iteration over the responses, `cancel`), over one TCP (or TLS) connection made
when the call starts. A connection that fails or breaks raises OSError (or IncompleteReadError mid-frame), which
the stream reports as UNAVAILABLE, as it does a gRPC stream that breaks."""
from __future__ import annotations

import asyncio

from specd.serve_socket import frame, frames
from specd.v1 import verifier_pb2


class SocketCall:
    def __init__(self, host: str, port: int, ssl_context) -> None:
        self._connected = asyncio.ensure_future(asyncio.open_connection(host, port, ssl=ssl_context))

    async def write(self, message: verifier_pb2.ServeRequest) -> None:
        _, writer = await self._connected
        writer.write(frame(message))
        await writer.drain()

    def __aiter__(self):
        return self._responses()

    async def _responses(self):
        reader, _ = await self._connected
        async for message in frames(reader, verifier_pb2.ServeResponse):
            yield message

    def cancel(self) -> None:
        """Closes the connection (the verifier aborts the requests still on it)."""
        if not self._connected.done():
            self._connected.cancel()
        elif not self._connected.cancelled() and self._connected.exception() is None:
            self._connected.result()[1].close()
