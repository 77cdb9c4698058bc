"""POST /v1/completions and /v1/chat/completions: a plain ASGI app in front of the FastAPI one.

These two routes carry every streamed token, so each server-sent event goes straight to uvicorn's `send`, not
through Starlette's wrappers of it (its error and exception middleware, StreamingResponse's task group); with the
per-token trims of the same change, 32 against 38 us of gateway CPU a token on the 2-core machine
(docs/BENCHMARKS.md round 42). Everything else (models, health, metrics, unknown paths) is the FastAPI app's. Errors are answered as it answers them
(gateway/openai/http_errors.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai import responses
from gateway.openai.choices import best, collect, interleaved, sample_requests, total_usage
from gateway.openai.http_body import read_json_object
from gateway.openai.http_errors import ANSWERED_ERRORS, ClientGone, error_response
from gateway.openai.schema import ChatCompletionBody, CompletionBody, parse_body
from gateway.openai.unsupported import without_unsupported
from gateway.pipeline import Pipeline
from gateway.request import TextChunk
from gateway.router import UpstreamError
from gateway.tenant import TENANT_HEADER, tenant_key

logger = logging.getLogger(__name__)

ROUTES = {"/v1/completions": CompletionBody, "/v1/chat/completions": ChatCompletionBody}
_EVENT_STREAM = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]}


class GenerationRoutes:
    """Serves ROUTES itself and hands every other request to `app`."""

    def __init__(self, app, pipeline: Pipeline, request_timeout_seconds: float | None = None) -> None:
        self.app, self.pipeline, self.timeout = app, pipeline, request_timeout_seconds

    async def __call__(self, scope, receive, send) -> None:
        schema = ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if schema is None:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        try:
            if request.method != "POST":
                raise HTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
            answer = await self._respond(request, schema)
        except Exception as error:  # noqa: BLE001 - every error is answered, and a bug's traceback logged
            if not isinstance(error, ANSWERED_ERRORS):
                logger.exception("%s %s failed", request.method, request.url.path)
            answer = error_response(error, self.pipeline.metrics, request.method, request.url.path)
        if isinstance(answer, Response):
            return await answer(scope, receive, send)
        await _send_events(answer, receive, send)

    async def _respond(self, request: Request, schema) -> JSONResponse | AsyncIterator[bytes]:
        """The full response, or a stream's events once its first chunk has come (so that a failure before any
        token is a proper HTTP status)."""
        pipeline = self.pipeline
        data = await read_json_object(request, pipeline.max_body_bytes())
        body = parse_body(schema, without_unsupported(data))
        pipeline.check_model(body.model)
        n, best_of = body.choices()
        headers = request.headers
        generation = await pipeline.validate(body.request_fields(),
                                             tenant_key(headers.get("authorization"), headers.get(TENANT_HEADER)))
        deadline = None if self.timeout is None else asyncio.get_running_loop().time() + self.timeout
        writer = responses.ResponseWriter(pipeline.model_name, chat=schema is ChatCompletionBody)
        ranked = best_of > n  # samples are ranked by their logprobs, asked for if the client did not
        sampled = generation.with_sampling(logprobs=generation.sampling.logprobs or 0) if ranked else generation
        chunks = interleaved(pipeline, sample_requests(sampled, best_of), deadline)
        if body.stream:
            first = await _until_disconnected(request, anext(chunks))
            return _events(first, chunks, writer, body.include_usage)
        choices = await _until_disconnected(request, collect(chunks))
        usage = total_usage([choice.usage for choice in choices])
        seed = choices[0].seed  # sample 0's: with the same n and best_of it reproduces every sample
        if ranked:
            choices = best(choices, n, keep_logprobs=generation.sampling.logprobs is not None)
        return JSONResponse(writer.full(choices, usage, seed))


async def _events(first: TextChunk, chunks: AsyncIterator[TextChunk],
                  writer: responses.ResponseWriter, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE stream; closing it early closes `chunks` (and with them the verifier calls)."""
    try:
        usages = []
        chunk = first
        while True:
            yield writer.event(chunk.text, chunk.finish_reason or None, chunk.logprobs, chunk.index, chunk.seed)
            if chunk.finish_reason:
                usages.append(chunk.usage)
            try:
                chunk = await anext(chunks)
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


async def _send_events(events: AsyncIterator[bytes], receive, send) -> None:
    """Sends `events` as a text/event-stream body. A client that disconnects cancels it: uvicorn's `send` would
    go on taking events and dropping them."""
    sending, finished, gone = asyncio.current_task(), False, False

    async def cancel_when_gone() -> None:
        nonlocal gone
        await _disconnected(receive)
        if not finished:  # receive() says disconnect once the response is complete, too
            gone = True
            sending.cancel()

    watcher = asyncio.create_task(cancel_when_gone())
    try:
        await send(_EVENT_STREAM)
        async for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        finished = True
        await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not gone:
            raise
        sending.uncancel()  # the client left: nothing more to do
    finally:
        watcher.cancel()  # before anything here can yield: it cannot cancel this task any more
        await events.aclose()


async def _until_disconnected(request: Request, work):
    """Awaits `work`, cancelling it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        gone = not task.done()
        task.cancel()  # a no-op when done; else closes the pipeline and cancels the verifier call
    if gone:
        raise ClientGone()
    return task.result()


async def _disconnected(receive) -> None:
    """Returns once the ASGI connection says http.disconnect (the request's body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass
