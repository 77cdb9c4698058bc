"""`serve(config)`: one gateway process, gRPC (grpc.aio) and HTTP (uvicorn) on one event loop; `main(config)` runs
one, or several sharing the ports (gateway/processes.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gateway.auth import ApiKeyInterceptor
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.openai.http import create_app
from gateway.pipeline import Pipeline
from gateway.router import Router
from gateway.service import GatewayServicer
from gateway.tokenizer import Tokenizer
from specd import stop_signals
from specd.serving import GrpcServer, ServerConfig
from specd.startup_errors import bound_socket
from specd.v1 import gateway_pb2, gateway_pb2_grpc

logger = logging.getLogger(__name__)

GATEWAY_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


@dataclass
class RunningGateway:
    """A started gateway: its bound ports, and how to stop it."""

    pipeline: Pipeline
    grpc_server: GrpcServer
    http_server: uvicorn.Server
    http_task: asyncio.Task

    @property
    def grpc_port(self) -> int:
        return self.grpc_server.port

    @property
    def http_port(self) -> int:
        return self.http_server.servers[0].sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, stop taking calls, let in-flight ones finish, close channels."""
        self.http_server.should_exit = True
        await self.grpc_server.stop(grace)
        await self.http_task
        await self.pipeline.router.close()


def _model_max_len(model_path: Path) -> int:
    """The checkpoint's context length, the fallback until a verifier reports its own."""
    config = json.loads((model_path / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 2048)


def build_pipeline(config: GatewayConfig) -> Pipeline:
    """Tokenizer, router and metrics for `config` (the router is not started yet)."""
    model_path = Path(config.model_path)
    router = Router(config.verifier_addrs, config.tls, poll_interval=config.health_poll_seconds,
                    stream_interval=config.stream_interval, transport=config.verifier_transport)
    return Pipeline(Tokenizer(model_path), router, GatewayMetrics(),
                    model_max_len=config.max_model_len or _model_max_len(model_path),
                    model_name=model_path.name, log_requests=config.log_requests)


async def start(config: GatewayConfig) -> RunningGateway:
    """Binds both ports, then starts both servers; health says SERVING once they listen (verifier health is
    /health's job). Raises PortInUse naming the option that moves a taken port, with nothing left bound."""
    pipeline = build_pipeline(config)
    await pipeline.warm_up()
    interceptors = ([ApiKeyInterceptor(config.api_key, pipeline.metrics.count_rejected)]
                    if config.api_key else [])
    grpc_server = GrpcServer(
        ServerConfig(host=config.host, port=config.grpc_port, tls=config.tls,
                     grace_seconds=config.grace_seconds, reuse_port=config.reuse_port),
        service_names=[GATEWAY_SERVICE],
        register=lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(pipeline), server),
        interceptors=interceptors, registry=pipeline.metrics.registry)
    async with contextlib.AsyncExitStack() as undo:  # what started so far, stopped again if a later step fails
        undo.push_async_callback(pipeline.router.close)
        http_socket = bound_socket(config.host, config.http_port, "http-port", reuse_port=config.reuse_port)
        undo.callback(http_socket.close)
        await grpc_server.start()
        undo.push_async_callback(grpc_server.stop, 0)
        await pipeline.router.start()
        http_server = _http_server(config, pipeline)
        http_task = asyncio.create_task(http_server.serve(sockets=[http_socket]))
        while not http_server.started:  # uvicorn offers no event for this
            if http_task.done():
                await http_task  # surfaces the error
                raise RuntimeError(f"http_port: could not serve on {config.host}:{config.http_port}")
            await asyncio.sleep(0.01)
        undo.pop_all()
    await grpc_server.mark_ready()
    return RunningGateway(pipeline, grpc_server, http_server, http_task)


def _http_server(config: GatewayConfig, pipeline: Pipeline) -> uvicorn.Server:
    app = create_app(pipeline, config.api_key, config.request_timeout_seconds)
    tls = config.tls
    uvicorn_config = uvicorn.Config(
        app, host=config.host, port=config.http_port, log_level="warning", lifespan="off",
        http="httptools",  # frames each streamed event in C; h11 cost 7% more CPU per token (BENCHMARKS round 30)
        ssl_certfile=tls.cert_path if tls else None, ssl_keyfile=tls.key_path if tls else None,
        # With a CA, HTTPS clients must present a certificate it signed, as gRPC clients must (mTLS).
        ssl_ca_certs=tls.ca_path if tls else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.ca_path else ssl.CERT_NONE,
        timeout_graceful_shutdown=max(1, round(config.grace_seconds)))  # 0 would log an error
    return _EmbeddedUvicorn(uvicorn_config)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn sharing the gRPC server's process and loop: GrpcServer owns SIGTERM / SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve(config: GatewayConfig) -> None:
    """Runs the gateway until SIGTERM / SIGINT, then drains both servers."""
    async with stop_signals.caught() as stop_requested:
        gateway = await start(config)
        logger.info("gateway: gRPC on %s:%d, HTTP on %s:%d", config.host, gateway.grpc_port,
                    config.host, gateway.http_port)
        try:
            await gateway.grpc_server.serve_until(stop_requested)
        finally:
            await gateway.stop()
