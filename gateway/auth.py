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
