"""The OpenAI-compatible HTTP API (FastAPI): completions, chat completions, models, health, metrics.

Bodies are read by gateway/openai/http_body.py and typed by gateway/openai/schema.py; ranges are checked by the
shared validation; the pipeline does the rest. A client that disconnects cancels its request, and with it
the verifier call. Every error is an OpenAI error object, counted in specd_request_errors_total by the
grpc code of the same meaning.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from gateway.auth import ApiKeyMiddleware
from gateway.openai import responses
from gateway.openai.choices import best, collect, interleaved, sample_requests, total_usage
from gateway.openai.http_body import read_json_object
from gateway.openai.http_errors import ClientGone, install_error_handlers
from gateway.openai.schema import ChatCompletionBody, CompletionBody, parse_body
from gateway.openai.unsupported import without_unsupported
from gateway.pipeline import Pipeline
from gateway.request import TextChunk
from gateway.router import UpstreamError
from gateway.tenant import TENANT_HEADER, tenant_key


def create_app(pipeline: Pipeline, api_key: str | None = None,
               request_timeout_seconds: float | None = None) -> FastAPI:
    """The HTTP app around `pipeline`; with `api_key`, /v1/* requires `authorization: Bearer <key>`."""
    app = FastAPI(title="specd gateway", docs_url=None, redoc_url=None, openapi_url=None)
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, on_refused=pipeline.metrics.count_rejected,
                           refusal=JSONResponse(responses.error_body("missing or wrong API key",
                                                                     "authentication_error"), 401))
    install_error_handlers(app, pipeline.metrics)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, pipeline, CompletionBody, chat=False, timeout=request_timeout_seconds)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(request, pipeline, ChatCompletionBody, chat=True, timeout=request_timeout_seconds)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(pipeline)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in pipeline.served_model_names:
            raise HTTPException(404, f"no model {model_id!r}; this server serves {pipeline.model_name!r}")
        return _model_card(pipeline)

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


def _model_card(pipeline: Pipeline) -> dict:
    return {"id": pipeline.model_name, "object": "model", "created": 0, "owned_by": "specd",
            "max_model_len": pipeline.max_model_len()}


async def _generate(request: Request, pipeline: Pipeline, schema, chat: bool, timeout: float | None):
    data = await read_json_object(request, pipeline.max_body_bytes())
    body = parse_body(schema, without_unsupported(data))
    pipeline.check_model(body.model)
    n, best_of = body.choices()
    headers = request.headers
    generation = await pipeline.validate(body.request_fields(),
                                         tenant_key(headers.get("authorization"), headers.get(TENANT_HEADER)))
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    writer = responses.ResponseWriter(pipeline.model_name, chat)
    ranked = best_of > n  # samples are ranked by their logprobs, asked for if the client did not
    sampled = generation.with_sampling(logprobs=generation.sampling.logprobs or 0) if ranked else generation
    chunks = interleaved(pipeline, sample_requests(sampled, best_of), deadline)
    if body.stream:
        # The first chunk is awaited here so that a failure before any token is a proper HTTP status.
        first = await _until_disconnected(request, anext(chunks))
        return StreamingResponse(_events(first, chunks, writer, body.include_usage),
                                 media_type="text/event-stream")
    choices = await _until_disconnected(request, collect(chunks))
    usage = total_usage([choice.usage for choice in choices])
    seed = choices[0].seed  # sample 0's: with the same n and best_of it reproduces every sample
    if ranked:
        choices = best(choices, n, keep_logprobs=generation.sampling.logprobs is not None)
    return JSONResponse(writer.full(choices, usage, seed))


async def _events(first: tuple[int, TextChunk], chunks: AsyncIterator[tuple[int, TextChunk]],
                  writer: responses.ResponseWriter, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE stream; a disconnecting client cancels this task, which closes `chunks`."""
    try:
        usages = []
        index, chunk = first
        while True:
            yield writer.event(chunk.text, chunk.finish_reason or None, chunk.logprobs, index, chunk.seed)
            if chunk.finish_reason:
                usages.append(chunk.usage)
            try:
                index, chunk = await anext(chunks)
            except StopAsyncIteration:  # every choice has finished
                break
        if include_usage:
            yield responses.sse(writer.usage_chunk(total_usage(usages)))
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
