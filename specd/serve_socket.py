"""The Serve stream over a plain socket: the verifier's Serve socket and the gateway's connection to it share this.

A gRPC Serve stream costs its reader 180-280 us of CPU a message whatever it carries (tools/grpc_message_cost.py:
grpc's C-core thread, its Python poller thread and the event loop each wake per message), and a step is one message
to every gateway process. The socket carries the same protobuf messages as frames (a 4-byte little-endian length,
then the message) on an asyncio connection: the event loop's own thread reads them, one wake a step. vLLM's API
servers and SGLang's tokenizer manager talk to their engines over ZMQ sockets for the same reason.

TLS is the gRPC port's: `server_ssl` / `client_ssl` build the contexts from the same files.
"""
from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import AsyncIterator

from specd.serving import TlsConfig

_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = 64 << 20  # as the gRPC channels' message limit: a larger length is a broken peer


class FrameError(ConnectionError):
    """The peer sent something that is not a frame of this protocol."""


def host_of(address: str) -> str:
    """The host of a "HOST:PORT" address (an IPv6 one without its brackets): where its Serve socket is dialled."""
    return address.rsplit(":", 1)[0].strip("[]")


def frame(message) -> bytes:
    body = message.SerializeToString()
    return _LENGTH.pack(len(body)) + body


async def frames(reader: asyncio.StreamReader, message_type) -> AsyncIterator:
    """The messages the peer sends, until it closes its side (a cut mid-frame raises IncompleteReadError)."""
    while True:
        try:
            header = await reader.readexactly(_LENGTH.size)
        except asyncio.IncompleteReadError as error:
            if error.partial:
                raise
            return
        (length,) = _LENGTH.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise FrameError(f"a frame of {length} bytes: over the {MAX_FRAME_BYTES}-byte limit")
        yield message_type.FromString(await reader.readexactly(length))


def server_ssl(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """The verifier's side: its certificate; with a CA, clients must present one it signed (as the gRPC port)."""
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_path, tls.key_path)
    if tls.ca_path is not None:
        context.load_verify_locations(tls.ca_path)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """The gateway's side: the server checked against the CA (the system's without one), its own certificate
    presented when it has one."""
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=tls.ca_path)
    if tls.cert_path is not None:
        context.load_cert_chain(tls.cert_path, tls.key_path)
    return context
