"""One Serve stream (protos/specd/v1/verifier.proto): a gateway's requests over one bidirectional gRPC stream.

Starts and aborts come in on the stream; every request of the stream shares one queue with the engine loop, which
puts one list on it per step (engine_loop.py), so a step's news leaves as one ServeResponse, whatever the number of
requests. A start that cannot run is answered on the stream with the status Generate would have ended with:
INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED when the queue is full, ALREADY_EXISTS for a live id,
UNAVAILABLE while the verifier drains. A request whose timeout passes is aborted and answered DEADLINE_EXCEEDED.
When the stream ends (the gateway is gone, or it closed its side) every request still live is aborted.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from specd.sampling import InvalidParameter
from specd.v1 import verifier_pb2
from verifier_service.convert import ModelLimits, request_from_proto, serve_response
from verifier_service.engine.outputs import RequestOutput
from verifier_service.engine_loop import EngineLoop
from verifier_service.output_router import DuplicateRequestId, EngineUnavailable, RequestFailed


@dataclass(frozen=True)
class Refusal:
    """A request answered with a status instead of running (or stopped so: its deadline passed)."""

    request_id: str
    code: grpc.StatusCode
    message: str


def status_of(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status Generate's error path (specd/serving.py) gives an engine error."""
    if isinstance(error, InvalidParameter):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, EngineUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}"


def merged(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """One output per request: the news of several steps that queued up while a message was being sent, joined
    (tokens and logprobs in order, the last usage and finish reason), so the gateway handles them once."""
    by_request: dict[str, RequestOutput] = {}
    for output in outputs:
        earlier = by_request.get(output.request_id)
        if earlier is not None:
            logprobs = (earlier.logprobs or []) + (output.logprobs or []) if output.logprobs is not None else None
            output = dataclasses.replace(output, new_token_ids=earlier.new_token_ids + output.new_token_ids,
                                         logprobs=logprobs, seed=earlier.seed)
        by_request[output.request_id] = output
    return list(by_request.values())


class ServeStream:
    """The state of one stream; `read()` consumes the caller's messages, `responses()` yields the replies."""

    def __init__(self, engine_loop: EngineLoop, limits: ModelLimits, max_waiting_requests: int,
                 draining: asyncio.Event, first_token: Callable[[float], None]) -> None:
        self._engine_loop, self._limits = engine_loop, limits
        self._max_waiting_requests, self._draining = max_waiting_requests, draining
        self._first_token = first_token  # seconds from a start's arrival to its first update going out
        self._outbox: asyncio.Queue = asyncio.Queue()  # lists of RequestOutput | RequestFailed | Refusal
        self._live: set[str] = set()
        # live requests whose first update (which carries the seed) is unsent, with when their start arrived
        self._unseeded: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._num_refusals = 0  # refusals queued and not yet sent
        self._reading = True

    def wake(self) -> None:
        """Makes `responses()` look again whether the stream is done (the verifier started draining)."""
        self._outbox.put_nowait([])

    async def read(self, messages: AsyncIterator[verifier_pb2.ServeRequest]) -> None:
        try:
            async for message in messages:
                for start in message.starts:
                    self._start(start)
                for request_id in message.abort_request_ids:
                    self._abort(request_id)
        finally:
            self._reading = False
            self.wake()

    async def responses(self) -> AsyncIterator[verifier_pb2.ServeResponse]:
        """One message per batch of news; ends once the caller has closed its side (or the verifier drains) and
        no request of the stream is live."""
        while self._reading and not self._draining.is_set() or self._live or self._num_refusals:
            items = await self._outbox.get()
            while not self._outbox.empty():  # everything that is already here goes in one message
                items += self._outbox.get_nowait()
            if items:
                yield self._response(items)

    def close(self) -> None:
        """The stream is over: abort whatever it still runs."""
        for request_id in list(self._live):
            self._abort(request_id)

    def _response(self, items: list) -> verifier_pb2.ServeResponse:
        outputs: list[RequestOutput] = []
        errors: list[tuple[str, int, str]] = []
        ended: list[str] = []  # forgotten only once the message is built: a first update may also be the last
        for item in items:
            if isinstance(item, RequestOutput):
                outputs.append(item)
                if item.finished:
                    ended.append(item.request_id)
                continue
            if isinstance(item, RequestFailed):
                code, message = status_of(item.error)
                ended.append(item.request_id)
            else:
                code, message = item.code, item.message
                self._num_refusals -= 1
            errors.append((item.request_id, code.value[0], message))
        response = serve_response(merged(outputs), self._unseeded, errors)
        now = time.monotonic()
        for output in outputs:
            arrived = self._unseeded.pop(output.request_id, None)
            if arrived is not None:
                self._first_token(now - arrived)
        for request_id in ended:
            self._forget(request_id)
        return response

    def _start(self, start: verifier_pb2.ServeStart) -> None:
        request_id, arrived = start.request.request_id, time.monotonic()
        try:
            if self._draining.is_set():
                raise _Refused(grpc.StatusCode.UNAVAILABLE, "verifier is draining; retry on another replica")
            request_id, prompt, params = request_from_proto(start.request, self._limits)
            load, num_pending = self._engine_loop.queue_state()
            if load.num_waiting + num_pending >= self._max_waiting_requests:
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "verifier queue is full; retry later")
            self._engine_loop.add(request_id, prompt, params, self._outbox)
        except InvalidParameter as error:
            return self._refuse(request_id, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except DuplicateRequestId as error:
            return self._refuse(request_id, grpc.StatusCode.ALREADY_EXISTS, str(error))
        except _Refused as refused:
            return self._refuse(request_id, refused.code, refused.message)
        self._live.add(request_id)
        self._unseeded[request_id] = arrived
        if start.timeout_seconds > 0:
            self._timers[request_id] = asyncio.get_running_loop().call_later(
                start.timeout_seconds, self._expire, request_id)

    def _refuse(self, request_id: str, code: grpc.StatusCode, message: str) -> None:
        self._num_refusals += 1
        self._outbox.put_nowait([Refusal(request_id, code, message)])

    def _expire(self, request_id: str) -> None:
        if request_id in self._live:
            self._abort(request_id)
            self._refuse(request_id, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    def _abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._forget(request_id)
            self._engine_loop.abort(request_id)

    def _forget(self, request_id: str) -> None:
        self._live.discard(request_id)
        self._unseeded.pop(request_id, None)
        timer = self._timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message
