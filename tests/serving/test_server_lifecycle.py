"""The shared gRPC bootstrap on loopback: health transitions, reflection, /metrics, drain on SIGTERM."""
from __future__ import annotations

import asyncio
import os
import signal
import urllib.request

import grpc
import prometheus_client
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specd.serving import GrpcServer, ServerConfig, open_channel
from support.echo_service import SERVICE, SLOW, register_test_service

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# Async fixtures default to the session loop (pyproject), so the tests must run on it too.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(30)]


async def _health(channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status


@pytest.fixture
async def server():
    server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_seconds=5.0),
                        service_names=[SERVICE], register=register_test_service)
    await server.start()
    yield server
    await server.stop(grace=0)


async def test_health_is_not_serving_until_marked_ready(server):
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        assert await _health(channel, "") == NOT_SERVING
        assert await _health(channel, SERVICE) == NOT_SERVING
        await server.mark_ready()
        assert await _health(channel, "") == SERVING
        assert await _health(channel, SERVICE) == SERVING


async def test_reflection_lists_the_services(server):
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request])):
            names = {s.name for s in response.list_services_response.service}
            break
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


async def test_stop_drains_in_flight_calls_and_refuses_new_ones(server):
    await server.mark_ready()
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        slow = channel.unary_unary(SLOW)
        in_flight = asyncio.ensure_future(slow(b"0.3"))
        await asyncio.sleep(0.05)  # let the call reach the handler before draining starts
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.sleep(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await slow(b"0", timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await in_flight == b"done"
        await stopping


async def test_sigterm_sets_not_serving_and_drains(server):
    await server.mark_ready()
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == SERVING
        in_flight = asyncio.ensure_future(channel.unary_unary(SLOW)(b"0.3"))
        serving = asyncio.ensure_future(server.serve_until_signalled())
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        assert (await watch.read()).status == NOT_SERVING
        watch.cancel()  # a health watch never ends by itself; left open it would use the whole grace
        assert await in_flight == b"done"
        await asyncio.wait_for(serving, timeout=5)


async def test_metrics_endpoint_serves_the_registry():
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("specd_test_things", "Things.", registry=registry).inc(3)
    server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, metrics_port=0),
                        service_names=[SERVICE], register=register_test_service, registry=registry)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        assert "specd_test_things_total 3.0" in body
    finally:
        await server.stop(grace=0)
