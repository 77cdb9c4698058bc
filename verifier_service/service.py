"""The thin specd.v1.Verifier servicer: protobuf in, engine loop, protobuf out.

A Generate call is one engine request; its messages are the tokens accepted per step. When the call
ends early (client cancel, deadline, server drain), the request is aborted so its KV blocks are freed.
A Serve call carries many requests (serve_stream.py); gateways use it, so that a step costs one message each.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from specd.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.convert import ModelLimits, load_to_proto, output_to_proto, request_from_proto
from verifier_service.engine_loop import EngineLoop
from verifier_service.output_router import DuplicateRequestId, EngineUnavailable, RequestFailed
from verifier_service.serve_stream import ServeStream


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    """Answers UNAVAILABLE until `attach()` hands it the running engine (model loaded, warmed up): an EngineLoop in
    this process, or the engine process's EngineClient, which has its interface."""

    def __init__(self, max_waiting_requests: int, first_token: Callable[[float], None] = lambda seconds: None) -> None:
        """first_token: called with the seconds from a request's arrival here to its first tokens leaving (the
        verifier's time to first token: specd_verifier_time_to_first_token_seconds)."""
        self._first_token = first_token
        self._engine_loop: EngineLoop | None = None
        self._limits: ModelLimits | None = None
        self._max_waiting_requests = max_waiting_requests
        self._draining = asyncio.Event()
        self._streams: set[ServeStream] = set()
        self.serve_port = 0  # the Serve socket's port, reported with the load (0: none)
        self._drain_started: float | None = None

    def attach(self, engine_loop: EngineLoop, limits: ModelLimits) -> None:
        self._engine_loop = engine_loop
        self._limits = limits

    async def Generate(self, request: verifier_pb2.VerifierGenerateRequest, context: grpc.aio.ServicerContext):
        if self._engine_loop is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "verifier is loading its model")
        arrived = time.monotonic()
        request_id, prompt_token_ids, params = request_from_proto(request, self._limits)
        load, num_pending = self._engine_loop.queue_state()
        if load.num_waiting + num_pending >= self._max_waiting_requests:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "verifier queue is full; retry later")
        try:
            queue = self._engine_loop.add(request_id, prompt_token_ids, params)
        except DuplicateRequestId as error:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(error))
        finished, first = False, True
        try:
            while not finished:
                for output in await queue.get():
                    if isinstance(output, RequestFailed):
                        finished = True  # the engine already dropped the request
                        if isinstance(output.error, EngineUnavailable):
                            await context.abort(grpc.StatusCode.UNAVAILABLE, str(output.error))
                        raise output.error
                    finished = output.finished
                    if first:
                        self._first_token(time.monotonic() - arrived)
                    yield output_to_proto(output, first)
                    first = False
        finally:
            if not finished:  # cancelled, deadline passed, or the server is stopping
                self._engine_loop.abort(request_id)

    async def Serve(self, request_iterator, context: grpc.aio.ServicerContext):
        if self._engine_loop is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "verifier is loading its model")
        async for response in self.serve(request_iterator):
            yield response

    async def serve(self, messages: AsyncIterator[verifier_pb2.ServeRequest]) -> AsyncIterator[
            verifier_pb2.ServeResponse]:
        """One Serve stream, whatever carries it (gRPC Serve, or the Serve socket: serve_socket.py); none before
        `attach` (the socket then closes the connection, as gRPC Serve answers UNAVAILABLE). Closing it early aborts
        the requests it still runs."""
        if self._engine_loop is None:
            return
        stream = ServeStream(self._engine_loop, self._limits, self._max_waiting_requests, self._draining,
                             self._first_token)
        self._streams.add(stream)
        reader = asyncio.ensure_future(stream.read(messages))
        try:
            async for response in stream.responses():
                yield response
        finally:
            reader.cancel()
            stream.close()
            self._streams.discard(stream)

    def drain(self) -> None:
        """The server stops taking calls: streams refuse new starts and end once their requests have."""
        if not self._draining.is_set():
            self._drain_started = time.monotonic()
        self._draining.set()
        for stream in self._streams:
            stream.wake()

    async def streams_ended(self, grace_seconds: float) -> None:
        """Waits for every Serve stream to end, until `grace_seconds` after the drain began (gRPC's own stop waits
        only for its calls, not for the Serve socket's streams, which drain beside them)."""
        deadline = (self._drain_started or time.monotonic()) + grace_seconds
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def GetLoad(self, request: verifier_pb2.GetLoadRequest, context: grpc.aio.ServicerContext):
        if self._engine_loop is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "verifier is loading its model")
        return load_to_proto(*self._engine_loop.queue_state(), self._limits, self.serve_port)
