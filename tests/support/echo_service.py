"""A tiny raw-bytes gRPC service for testing the shared server bootstrap (specd/serving.py).

Its handlers misbehave on purpose, in both unary and streaming shapes, so the error interceptor can be
checked on each. Requests and responses are plain bytes (no serializers).
"""
from __future__ import annotations

import asyncio

import grpc

from specd.sampling import InvalidParameter

SERVICE = "specd.test.Echo"
ECHO = f"/{SERVICE}/Echo"
SLOW = f"/{SERVICE}/Slow"  # request: seconds to sleep, as ASCII; answers b"done"
FAIL = f"/{SERVICE}/Fail"
INVALID = f"/{SERVICE}/Invalid"
STREAM_FAIL = f"/{SERVICE}/StreamFail"  # yields b"first", then raises
STREAM_INVALID = f"/{SERVICE}/StreamInvalid"  # reads one message, then raises InvalidParameter


async def _echo(request: bytes, context) -> bytes:
    return request


async def _slow(request: bytes, context) -> bytes:
    await asyncio.sleep(float(request.decode()))
    return b"done"


async def _fail(request: bytes, context) -> bytes:
    raise RuntimeError("boom")


async def _invalid(request: bytes, context) -> bytes:
    raise InvalidParameter("top_p", "must be in (0, 1]")


async def _stream_fail(request: bytes, context):
    yield b"first"
    raise RuntimeError("boom mid-stream")


async def _stream_invalid(request_iterator, context):
    async for _ in request_iterator:
        raise InvalidParameter("num_draft_tokens", "must be <= 64")
        yield b"never"  # noqa: makes this an async generator


def register_test_service(server: grpc.aio.Server) -> None:
    """Add the test service to a server (pass as GrpcServer's `register`)."""
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Slow": grpc.unary_unary_rpc_method_handler(_slow),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Invalid": grpc.unary_unary_rpc_method_handler(_invalid),
        "StreamFail": grpc.unary_stream_rpc_method_handler(_stream_fail),
        "StreamInvalid": grpc.stream_stream_rpc_method_handler(_stream_invalid),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
