"""The shared interceptor: InvalidParameter -> INVALID_ARGUMENT naming the field, the rest -> INTERNAL."""
from __future__ import annotations

import logging

import grpc
import pytest

from specd.serving import GrpcServer, ServerConfig, open_channel
from support.echo_service import (ECHO, FAIL, INVALID, SERVICE, STREAM_FAIL, STREAM_INVALID,
                                  register_test_service)

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
async def channel():
    server = GrpcServer(ServerConfig(host="127.0.0.1", port=0),
                        service_names=[SERVICE], register=register_test_service)
    await server.start()
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel
    await server.stop(grace=0)


async def test_a_healthy_handler_is_untouched(channel):
    assert await channel.unary_unary(ECHO)(b"hello") == b"hello"


async def test_invalid_parameter_becomes_invalid_argument_naming_the_field(channel):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await channel.unary_unary(INVALID)(b"")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("top_p:")


async def test_unexpected_error_becomes_internal_with_one_log_line(channel, caplog):
    with caplog.at_level(logging.ERROR, logger="specd.serving"):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await channel.unary_unary(FAIL)(b"")
    assert error.value.code() == grpc.StatusCode.INTERNAL
    records = [r for r in caplog.records if r.name == "specd.serving"]
    assert len(records) == 1
    assert FAIL in records[0].getMessage() and "boom" in records[0].getMessage()


async def test_error_in_a_server_stream_keeps_earlier_messages_then_ends_internal(channel):
    call = channel.unary_stream(STREAM_FAIL)(b"")
    assert await call.read() == b"first"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call.read()
    assert error.value.code() == grpc.StatusCode.INTERNAL


async def test_invalid_parameter_in_a_bidirectional_stream(channel):
    call = channel.stream_stream(STREAM_INVALID)(iter([b"x"]))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call.read()
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "num_draft_tokens" in error.value.details()
