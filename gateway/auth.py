"""The API-key check: `authorization: Bearer <key>` on every gRPC call and HTTP request when a key is set."""
from __future__ import annotations

import hmac
from collections.abc import Callable

import grpc

# Probes and scrapers must work without the key.
OPEN_HTTP_PATHS = frozenset({"/health", "/metrics"})
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def bearer_matches(header: str | None, api_key: str) -> bool:
    """Whether an authorization header value carries `api_key` (compared in constant time)."""
    if header is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].encode(), api_key.encode())


class ApiKeyMiddleware:
    """The HTTP side: a plain ASGI middleware that answers 401 (an OpenAI error object) without the right key,
    /health and /metrics open. (Starlette's BaseHTTPMiddleware would run every streamed chunk through its own
    memory streams: a fifth of the gateway's CPU per token.)"""

    def __init__(self, app, api_key: str, on_refused: Callable[[str], None], refusal) -> None:
        """`refusal` is the ASGI response sent instead (built by the HTTP front end)."""
        self.app, self.api_key, self.on_refused, self.refusal = app, api_key, on_refused, refusal

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_HTTP_PATHS:
            return await self.app(scope, receive, send)
        header = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if bearer_matches(header.decode("latin-1") if header is not None else None, self.api_key):
            return await self.app(scope, receive, send)
        self.on_refused(grpc.StatusCode.UNAUTHENTICATED.name)
        await self.refusal(scope, receive, send)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses gRPC calls without the right key with UNAUTHENTICATED (health and reflection stay open)."""

    def __init__(self, api_key: str, on_refused: Callable[[str], None] = lambda code: None) -> None:
        """`on_refused` is told the status name of each refused call (the error metric)."""
        self.api_key = api_key

        async def refuse(request, context: grpc.aio.ServicerContext):
            on_refused(grpc.StatusCode.UNAUTHENTICATED.name)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization: missing or wrong API key")

        self._refusal = grpc.unary_stream_rpc_method_handler(refuse)

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(OPEN_GRPC_PREFIXES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        if bearer_matches(metadata.get("authorization"), self.api_key):
            return await continuation(handler_call_details)
        return self._refusal
