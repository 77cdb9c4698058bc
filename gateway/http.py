"""The OpenAI-compatible HTTP API (FastAPI): completions, chat completions, models, health, metrics.

Bodies are parsed here (content type, JSON, types); ranges are checked by the shared validation; the
pipeline does the rest. A client that disconnects cancels its request, and with it the verifier call.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from gateway import openai_responses as responses
from gateway.auth import OPEN_HTTP_PATHS, bearer_matches
from gateway.openai_schema import ChatCompletionBody, CompletionBody
from gateway.pipeline import Pipeline
from gateway.request import TextChunk
from gateway.router import UpstreamError
from gateway.tenant import TENANT_HEADER, tenant_key
from gateway.validation import RequestError
from specd.serving import MAX_MESSAGE_BYTES

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # the same ceiling as a gRPC message


class ClientGone(Exception):
    """The HTTP client disconnected before its response was ready."""


def create_app(pipeline: Pipeline, api_key: str | None = None,
               request_timeout_seconds: float | None = None) -> FastAPI:
    """The HTTP app around `pipeline`; with `api_key`, /v1/* requires `authorization: Bearer <key>`."""
    app = FastAPI(title="specd gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if api_key is None or request.url.path in OPEN_HTTP_PATHS:
            return await call_next(request)
        if bearer_matches(request.headers.get("authorization"), api_key):
            return await call_next(request)
        pipeline.metrics.count_rejected("UNAUTHENTICATED")
        return JSONResponse(responses.error_body("missing or wrong API key", "authentication_error"), 401)

    @app.exception_handler(RequestError)
    async def bad_request(_request: Request, error: RequestError):
        pipeline.metrics.count_rejected("INVALID_ARGUMENT")
        return JSONResponse(responses.error_body(error.message, "invalid_request_error", error.field), 400)

    @app.exception_handler(UpstreamError)
    async def upstream_failed(_request: Request, error: UpstreamError):
        status, error_type = responses.status_for(error.code)
        return JSONResponse(responses.error_body(error.message, error_type), status)

    @app.exception_handler(ClientGone)
    async def client_gone(_request: Request, _error: ClientGone):
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, pipeline, CompletionBody, chat=False, timeout=request_timeout_seconds)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(request, pipeline, ChatCompletionBody, chat=True, timeout=request_timeout_seconds)

    @app.get("/v1/models")
    async def models():
        model = {"id": pipeline.model_name, "object": "model", "created": 0, "owned_by": "specd",
                 "max_model_len": pipeline.max_model_len()}
        return {"object": "list", "data": [model]}

    @app.get("/health")
    async def health():
        """200 while any verifier replica is healthy; `verifiers` tells each replica's state."""
        healthy = pipeline.router.any_healthy
        replicas = {r.address: "healthy" if r.healthy else "unhealthy" for r in pipeline.router.replicas}
        return JSONResponse({"status": "ok" if healthy else "no healthy verifier", "verifiers": replicas},
                            200 if healthy else 503)

    @app.get("/metrics")
    async def metrics():
        body, content_type = pipeline.metrics.exposition()
        return Response(body, media_type=content_type)

    return app


async def _parse(request: Request, schema):
    """The body as `schema`; RequestError naming the field on a wrong content type, bad JSON or types."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise RequestError("content-type", "must be application/json")
    size = request.headers.get("content-length", "0")
    if not size.isdigit() or int(size) > MAX_BODY_BYTES:  # refused before a byte of it is read
        raise RequestError("body", f"is {size} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError("body", f"malformed JSON: {error}") from error
    if not isinstance(data, dict):
        raise RequestError("body", "must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise RequestError(field, first["msg"]) from error


async def _generate(request: Request, pipeline: Pipeline, schema, chat: bool, timeout: float | None):
    body = await _parse(request, schema)
    pipeline.check_model(body.model)
    headers = request.headers
    generation = pipeline.validate(body.request_fields(),
                                   tenant_key(headers.get("authorization"), headers.get(TENANT_HEADER)))
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    writer = responses.ResponseWriter(pipeline.model_name, chat)
    chunks = pipeline.generate(generation, deadline)
    if body.stream:
        # The first chunk is awaited here so that a failure before any token is a proper HTTP status.
        first = await _until_disconnected(request, anext(chunks))
        return StreamingResponse(_events(first, chunks, writer, body.include_usage),
                                 media_type="text/event-stream")
    return JSONResponse(await _until_disconnected(request, _collect(chunks, writer)))


async def _collect(chunks: AsyncIterator[TextChunk], writer: responses.ResponseWriter) -> dict:
    texts = []
    async for chunk in chunks:
        texts.append(chunk.text)
        if chunk.finish_reason:
            return writer.full("".join(texts), chunk.finish_reason, chunk.usage)
    raise AssertionError("the pipeline ended without a finish_reason")


async def _events(first: TextChunk, chunks: AsyncIterator[TextChunk], writer: responses.ResponseWriter,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE stream; a disconnecting client cancels this task, which closes `chunks`."""
    try:
        chunk = first
        while True:
            yield responses.sse(writer.chunk(chunk.text, chunk.finish_reason or None))
            if chunk.finish_reason:
                if include_usage:
                    yield responses.sse(writer.usage_chunk(chunk.usage))
                break
            chunk = await anext(chunks)
    except UpstreamError as error:
        _status, error_type = responses.status_for(error.code)
        yield responses.sse(responses.error_body(error.message, error_type))
    finally:
        await chunks.aclose()
    yield responses.sse("[DONE]")


async def _until_disconnected(request: Request, work):
    """Awaits `work`, cancelling it if the client disconnects first (Starlette only notices that when streaming)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        gone = not task.done()
        task.cancel()  # a no-op when done; else closes the pipeline and cancels the verifier call
    if gone:
        raise ClientGone()
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
