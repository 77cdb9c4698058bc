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


# What error_response answers as the client's or the verifier's doing; anything else is a bug.
ANSWERED_ERRORS = (RequestError, BodyTooLarge, HTTPException, UpstreamError, ClientGone)


def error_response(error: Exception, metrics: GatewayMetrics, method: str, path: str) -> Response:
    """The answer to `error`, raised while serving `method path`, counted (UpstreamError is counted by the
    pipeline, which sees it first); anything unexpected is a 500 that does not tell the client why."""
    if isinstance(error, RequestError):
        metrics.count_rejected("INVALID_ARGUMENT")
        return JSONResponse(responses.error_body(error.message, "invalid_request_error", error.field), 400)
    if isinstance(error, BodyTooLarge):
        metrics.count_rejected("RESOURCE_EXHAUSTED")  # what gRPC answers to an oversized message
        return JSONResponse(responses.error_body(error.message, "invalid_request_error", "body"), 413)
    if isinstance(error, HTTPException):
        error_type, code = _ROUTING_ERRORS.get(error.status_code, ("invalid_request_error", "INVALID_ARGUMENT"))
        metrics.count_rejected(code)
        message = f"{method} {path}: {error.detail}"
        return JSONResponse(responses.error_body(message, error_type), error.status_code, headers=error.headers)
    if isinstance(error, UpstreamError):
        status, error_type = responses.status_for(error.code)
        return JSONResponse(responses.error_body(error.message, error_type), status)
    if isinstance(error, ClientGone):
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
    metrics.count_rejected("INTERNAL")
    return JSONResponse(responses.error_body("internal error", "server_error"), 500)


def install_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    """Answers each error of `app` with error_response. (Starlette logs an unexpected one with its traceback.)"""

    async def handle(request: Request, error: Exception) -> Response:
        return error_response(error, metrics, request.method, request.url.path)

    for kind in (*ANSWERED_ERRORS, Exception):
        app.add_exception_handler(kind, handle)
