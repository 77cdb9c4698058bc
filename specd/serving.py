"""The one gRPC server bootstrap every specd service uses, and the matching client channel.

A service builds a `ServerConfig`, hands `GrpcServer` a function that registers its servicers, and
runs it:

    server = GrpcServer(config, service_names=[drafter_pb2.DESCRIPTOR.services_by_name["Drafter"]
                                               .full_name],
                        register=lambda s: add_DrafterServicer_to_server(servicer, s))
    await server.start()            # binds gRPC (and /metrics); health says NOT_SERVING
    ...load / warm up...
    await server.mark_ready()       # health says SERVING for "" and every named service
    await server.serve_until_signalled()   # SIGTERM / SIGINT -> drain -> stop(grace)

What every server gets, so no service re-implements it:
- `grpc.health.v1` health for the overall service "" and each named service: NOT_SERVING until
  `mark_ready()`, NOT_SERVING again as soon as draining starts.
- Server reflection for the named services (plus health and reflection themselves).
- `ErrorMappingInterceptor`: `InvalidParameter` -> INVALID_ARGUMENT naming
  the field, any other unexpected exception -> INTERNAL with one log line.
- Keepalive and message-size options shared with clients (`channel_options()`).
- Optional TLS; with a CA path, mutual TLS (clients must present a certificate signed by that CA).
- A Prometheus `/metrics` HTTP endpoint on `metrics_port` (None = none, 0 = any free port).

Clients open channels with `open_channel(target, tls)` (grpc.aio by default, `asynchronous=False`
for the sync API) so that both ends agree on keepalive, message sizes and TLS.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import prometheus_client
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specd import stop_signals
from specd.sampling import InvalidParameter
from specd.startup_errors import PortInUse, bound_socket

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 128k-token context as int32 ids is 0.5 MB; leave headroom


@dataclass(frozen=True)
class TlsConfig:
    """PEM file paths. A server needs cert + key; a CA makes it require client certificates (mTLS).

    A client uses the CA to verify the server (None = the system roots) and presents cert + key as
    its own certificate when both are given.
    """

    cert_path: str | None = None
    key_path: str | None = None
    ca_path: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_path is None) != (self.key_path is None):
            raise ValueError("tls: cert_path and key_path must be given together")


@dataclass(frozen=True)
class ServerConfig:
    """Where and how a gRPC server listens."""

    host: str = "0.0.0.0"
    port: int = 0  # 0 = any free port (tests); GrpcServer.port tells the bound one
    metrics_port: int | None = None  # None = no /metrics endpoint; 0 = any free port
    tls: TlsConfig | None = None
    grace_seconds: float = 10.0  # how long in-flight calls may run on after SIGTERM
    reuse_port: bool = False  # share the port with sibling processes that set it too (gateway/processes.py)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not a TCP port")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: {self.metrics_port} is not a TCP port")
        if self.tls is not None and self.tls.cert_path is None:
            raise ValueError("tls: a server needs cert_path and key_path")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds: must be >= 0")


def channel_options() -> list[tuple[str, int]]:
    """gRPC options both servers and clients use: keepalive that each side accepts, message sizes."""
    return [
        ("grpc.keepalive_time_ms", 20_000),  # ping an idle connection so dead peers are noticed
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Servers accept pings as often as clients send them, so a client is never sent GOAWAY.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """The one error path: a handler's exception becomes a status, logged once.

    `InvalidParameter` -> INVALID_ARGUMENT with its message (which starts with the field name);
    any other exception -> INTERNAL, with one log line naming the method and where it was raised.
    Aborts (`context.abort`) and cancellations pass through untouched. Covers unary and streaming
    handlers written as coroutines or async generators.
    """

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        for kind, factory in _HANDLER_FACTORIES.items():
            behavior = getattr(handler, kind)
            if behavior is not None:
                deserializer = handler.request_deserializer
                if kind.startswith("unary_") and deserializer is not None:
                    deserializer = _tolerant(deserializer)
                return factory(_guard(behavior, method), request_deserializer=deserializer,
                               response_serializer=handler.response_serializer)
        return handler


_HANDLER_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True)
class _UndecodableRequest:
    """Stands in for a request whose bytes are not a valid message (e.g. a string field that is not UTF-8)."""

    reason: str


def _tolerant(deserializer):
    """grpc answers a request that fails to parse with UNKNOWN and a traceback in the log; parse
    failures become an `_UndecodableRequest` instead, which `_guard` answers with INVALID_ARGUMENT."""
    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except DecodeError as error:
            return _UndecodableRequest(str(error))
    return deserialize


async def _refuse_undecodable(request, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _UndecodableRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"request: cannot be decoded ({request.reason}); string fields must be valid UTF-8")


def _guard(behavior, method: str):
    """Wrap a handler so its exceptions go through _abort_for; sync handlers are left alone."""
    if inspect.isasyncgenfunction(behavior):
        async def streaming(request, context):
            await _refuse_undecodable(request, context)
            try:
                async for response in behavior(request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001 - the one place that maps every error
                await _abort_for(error, method, context)
        return streaming
    if inspect.iscoroutinefunction(behavior):
        async def unary(request, context):
            await _refuse_undecodable(request, context)
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001
                await _abort_for(error, method, context)
        return unary
    return behavior


async def _abort_for(error: Exception, method: str, context: grpc.aio.ServicerContext) -> None:
    if isinstance(error, InvalidParameter):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    frame = traceback.extract_tb(error.__traceback__)[-1]
    logger.error("%s failed: %s: %s (at %s:%d)", method, type(error).__name__, error,
                 frame.filename, frame.lineno)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}")


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(target: str, tls: TlsConfig | None = None, *, asynchronous: bool = True,
                 server_name: str | None = None,
                 extra_options: Sequence[tuple[str, int | str]] = ()) -> grpc.aio.Channel | grpc.Channel:
    """A channel to `target` ("host:port") with the shared options; TLS when `tls` is given.

    `server_name` overrides the name checked against the server's certificate (tests, IP targets);
    `extra_options` adds channel options (e.g. reconnect backoff).
    """
    options = channel_options() + list(extra_options)
    if server_name is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    if tls is None:
        factory = grpc.aio.insecure_channel if asynchronous else grpc.insecure_channel
        return factory(target, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_path),
        private_key=_read(tls.key_path),
        certificate_chain=_read(tls.cert_path),
    )
    factory = grpc.aio.secure_channel if asynchronous else grpc.secure_channel
    return factory(target, credentials, options=options)


def _server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    ca = _read(tls.ca_path)
    return grpc.ssl_server_credentials(
        [(_read(tls.key_path), _read(tls.cert_path))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


class GrpcServer:
    """A grpc.aio server with health, reflection, error mapping, TLS, /metrics and graceful drain."""

    def __init__(self, config: ServerConfig, *, service_names: Sequence[str],
                 register: Callable[[grpc.aio.Server], None],
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 registry: prometheus_client.CollectorRegistry = prometheus_client.REGISTRY,
                 on_drain: Callable[[], None] = lambda: None) -> None:
        """`service_names` are full names ("specd.v1.Drafter"); `register` adds the servicers.

        `interceptors` run after the error-mapping one (e.g. the gateway's API-key check); `on_drain` runs when a
        stop begins, before in-flight calls are given their grace (long-lived streams learn to wind down).
        """
        self.config = config
        self.service_names = tuple(service_names)
        self._register = register
        self._interceptors = (ErrorMappingInterceptor(), *interceptors)
        self._on_drain = on_drain
        self._registry = registry
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._metrics_http = None
        self.port: int | None = None  # bound gRPC port, after start()
        self.metrics_port: int | None = None  # bound /metrics port, after start()

    async def start(self) -> None:
        """Bind every port and start serving; health reports NOT_SERVING until mark_ready().

        Raises PortInUse naming the option that moves the port, with nothing left bound."""
        if self.config.metrics_port is not None:
            self._start_metrics()
        try:
            await self._start_grpc()
        except BaseException:
            self._stop_metrics()
            raise
        logger.info("serving %s on %s:%d", ", ".join(self.service_names), self.config.host, self.port)

    async def _start_grpc(self) -> None:
        host, port = self.config.host, self.config.port
        reuse_port = self.config.reuse_port
        if port and not reuse_port:  # checked first: grpc's own failure is a multi-line log of its C core
            bound_socket(host, port, "port").close()
        # Without so_reuseport 0, a second server on a taken port would share it with the first, silently.
        server = grpc.aio.server(interceptors=self._interceptors,
                                 options=channel_options() + [("grpc.so_reuseport", int(reuse_port))])
        self._register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            if self.config.tls is None:
                self.port = server.add_insecure_port(f"{host}:{port}")
            else:
                self.port = server.add_secure_port(f"{host}:{port}", _server_credentials(self.config.tls))
        except RuntimeError as error:  # grpc's "Failed to bind to address"
            await server.stop(None)
            raise PortInUse(host, port, "port") from error
        await server.start()
        self._server = server

    def _start_metrics(self) -> None:
        try:
            http_server, _thread = prometheus_client.start_http_server(
                self.config.metrics_port, addr=self.config.host, registry=self._registry)
        except OSError as error:
            raise PortInUse(self.config.host, self.config.metrics_port, "metrics-port") from error
        self._metrics_http = http_server
        self.metrics_port = http_server.server_address[1]

    def _stop_metrics(self) -> None:
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None

    async def _set_health(self, status: int) -> None:
        for name in ("", *self.service_names):
            await self._health.set(name, status)

    async def mark_ready(self) -> None:
        """Report SERVING: call once the service can answer (model loaded and warmed up)."""
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def mark_not_serving(self) -> None:
        """Report NOT_SERVING while still answering (a verifier whose model can no longer run)."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, refuse new calls, let in-flight ones finish within `grace`."""
        if self._server is None:
            return
        grace = self.config.grace_seconds if grace is None else grace
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._on_drain()
        await self._server.stop(grace)
        self._server = None
        self._stop_metrics()
        logger.info("stopped %s", ", ".join(self.service_names))

    async def serve_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT (or the server ends), then drain and stop."""
        async with stop_signals.caught() as stop_requested:
            await self.serve_until(stop_requested)

    async def serve_until(self, stop_requested: asyncio.Event) -> None:
        """Serve until `stop_requested` is set (or the server ends), then drain and stop."""
        terminated = asyncio.ensure_future(self._server.wait_for_termination())
        signalled = asyncio.ensure_future(stop_requested.wait())
        await asyncio.wait({terminated, signalled}, return_when=asyncio.FIRST_COMPLETED)
        signalled.cancel()
        if stop_requested.is_set():
            logger.info("stop requested: draining for up to %.1f s", self.config.grace_seconds)
        await self.stop()
        terminated.cancel()
