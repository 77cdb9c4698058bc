"""Every HTTP error as an OpenAI error object `{"error": {"message", "type", "param", "code"}}`, each
counted in specd_request_errors_total under the grpc code of the same meaning (docs/PUBLIC_SURFACE.md)."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from gateway.metrics import GatewayMetrics
from gateway.openai import responses
from gateway.openai.http_body import BodyTooLarge
from gateway.router import UpstreamError
from gateway.validation import RequestError

# HTTP statuses the app answers itself -> (OpenAI error type, grpc code name it is counted as)
_ROUTING_ERRORS = {404: ("not_found_error", "NOT_FOUND"), 405: ("invalid_request_error", "UNIMPLEMENTED")}


class ClientGone(Exception):
    """The HTTP client disconnected before its response was ready."""


def install_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    """Answers each error of `app` as an OpenAI error object and counts it (UpstreamError is counted by
    the pipeline, which sees it first)."""

    @app.exception_handler(RequestError)
    async def bad_request(_request: Request, error: RequestError):
        metrics.count_rejected("INVALID_ARGUMENT")
        return JSONResponse(responses.error_body(error.message, "invalid_request_error", error.field), 400)

    @app.exception_handler(BodyTooLarge)
    async def too_large(_request: Request, error: BodyTooLarge):
        metrics.count_rejected("RESOURCE_EXHAUSTED")  # what gRPC answers to an oversized message
        return JSONResponse(responses.error_body(error.message, "invalid_request_error", "body"), 413)

    @app.exception_handler(HTTPException)
    async def no_such_route(request: Request, error: HTTPException):
        error_type, code = _ROUTING_ERRORS.get(error.status_code, ("invalid_request_error", "INVALID_ARGUMENT"))
        metrics.count_rejected(code)
        message = f"{request.method} {request.url.path}: {error.detail}"
        return JSONResponse(responses.error_body(message, error_type), error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def server_error(_request: Request, _error: Exception):
        """A bug: logged with its traceback (by Starlette), answered without one."""
        metrics.count_rejected("INTERNAL")
        return JSONResponse(responses.error_body("internal error", "server_error"), 500)

    @app.exception_handler(UpstreamError)
    async def upstream_failed(_request: Request, error: UpstreamError):
        status, error_type = responses.status_for(error.code)
        return JSONResponse(responses.error_body(error.message, error_type), status)

    @app.exception_handler(ClientGone)
    async def client_gone(_request: Request, _error: ClientGone):
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
