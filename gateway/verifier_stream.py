"""A gateway's one Serve stream to a verifier replica (protos/specd/v1/verifier.proto), shared by all its requests.

`start()` sends a request and returns the `Updates` its updates arrive on; `abort()` stops it. Starts and aborts that
pile up while a write is under way leave together in the next message. One task reads the stream and hands each
request its update from every (columnar) message: a step costs one gRPC message per gateway, not one per request.
The stream is the replica's Serve socket (gateway/serve_socket.py) where its load report names one, else gRPC Serve.
It opens on first use; if it ends or breaks, every request on it gets an UpstreamError with its status
(UNAVAILABLE when it simply ended), so the router resumes it on another replica, and the next start opens a new one.
"""
from __future__ import annotations

import asyncio
import logging
import ssl

import grpc

from gateway.request import TokenLogprobs, Usage, VerifierChunk
from gateway.serve_socket import SocketCall
from specd.serve_socket import host_of
from specd.v1 import verifier_pb2

logger = logging.getLogger(__name__)


class UpstreamError(Exception):
    """The verifier call failed; `code` is the grpc status to report to the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Updates:
    """One request's updates (VerifierChunk | UpstreamError), in order: put by the stream's reader, taken by the
    request all at once. Lighter than an asyncio.Queue, on a path taken once per step for every request.

    With a stream interval N > 1 (--stream-interval, as vLLM's and SGLang's) the request wakes once N tokens have
    come since it last took, or at its first token, its end or an error: one detokenize, one event and one write for
    N tokens, for less gateway CPU a token and a burstier stream."""

    __slots__ = ("_items", "_waiter", "_interval", "_tokens", "_due", "_ready")

    def __init__(self, interval: int = 1) -> None:
        self._items: list = []
        self._waiter: asyncio.Future | None = None
        self._interval = interval
        self._tokens = 0  # tokens put since the last take
        self._due = 1  # tokens that wake the request: the first one at once, then `interval` at a time
        self._ready = False

    def put(self, update) -> None:
        self._items.append(update)
        if isinstance(update, VerifierChunk) and not update.finish_reason:
            self._tokens += len(update.token_ids)
            if self._tokens < self._due:
                return
        self._ready = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list:
        """Every update that has arrived since the last take, waiting until they are due if they are not."""
        while not self._ready:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items, self._items = self._items, []
        self._tokens, self._due, self._ready = 0, self._interval, False
        return items


class VerifierStream:
    def __init__(self, stub, address: str, stream_interval: int = 1, serve_socket=lambda: 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """serve_socket: the replica's Serve socket port when a stream opens (0: none, gRPC Serve then), dialled
        with ssl_context (None: plain TCP)."""
        self._stub, self.address, self._stream_interval = stub, address, stream_interval
        self.host = host_of(address)  # where a Serve socket is dialled
        self._serve_socket, self._ssl = serve_socket, ssl_context
        self._call = None
        self._live: dict[str, Updates] = {}  # request id -> its updates
        self._starts: list[verifier_pb2.ServeStart] = []
        self._aborts: list[str] = []
        self._pending = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def start(self, request: verifier_pb2.VerifierGenerateRequest, timeout: float | None) -> Updates:
        """Sends `request`; its updates, ending with a finish_reason or an UpstreamError, arrive on what it returns."""
        if self._call is None:
            self._open()
        updates = self._live[request.request_id] = Updates(self._stream_interval)
        self._starts.append(verifier_pb2.ServeStart(request=request, timeout_seconds=timeout or 0.0))
        self._pending.set()
        return updates

    def abort(self, request_id: str) -> None:
        """Stops a live request (a no-op for one that has finished)."""
        if self._live.pop(request_id, None) is not None and self._call is not None:
            self._aborts.append(request_id)
            self._pending.set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._call is not None:
            self._call.cancel()

    def _open(self) -> None:
        port = self._serve_socket()
        if port:
            self._call = SocketCall(self.host, port, self._ssl)
        else:
            self._call = self._stub.Serve()
        self._tasks = [asyncio.create_task(self._write(self._call)), asyncio.create_task(self._read(self._call))]

    async def _write(self, call) -> None:
        while True:
            await self._pending.wait()
            self._pending.clear()
            starts, self._starts = self._starts, []
            aborts, self._aborts = self._aborts, []
            try:
                await call.write(verifier_pb2.ServeRequest(starts=starts, abort_request_ids=aborts))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, OSError):
                return  # the reader sees the stream end and fails its requests

    async def _read(self, call) -> None:
        code, details = grpc.StatusCode.UNAVAILABLE, "the stream ended"
        try:
            async for response in call:
                self._dispatch(response)
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details()
        except (OSError, asyncio.IncompleteReadError) as error:  # the Serve socket failed or broke
            details = f"Serve socket: {error}"
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "the gateway is closing"
            raise
        finally:
            self._end(call, code, f"verifier {self.address}: {details}")

    def _end(self, call, code: grpc.StatusCode, message: str) -> None:
        if self._call is call:
            self._call = None
            for task in self._tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self._starts, self._aborts = [], []
        live, self._live = self._live, {}
        for updates in live.values():
            updates.put(UpstreamError(code, message))
        if live:
            logger.warning("stream to verifier %s ended (%s) with %d requests live", self.address, code.name, len(live))

    def _dispatch(self, response: verifier_pb2.ServeResponse) -> None:
        # Each column is read out of the message once, not once per request: this runs every step for every request.
        counts, token_ids, finish_reasons = response.token_counts, list(response.token_ids), response.finish_reasons
        usages = zip(response.prompt_tokens, response.completion_tokens, response.draft_tokens,
                     response.accepted_tokens, response.steps, response.num_speculative_tokens)
        errors, seeds, has_logprobs = response.errors, dict(response.seeds), len(response.logprobs) > 0
        position = 0
        for index, (request_id, count, finish_reason, usage) in enumerate(
                zip(response.request_ids, counts, finish_reasons, usages)):
            tokens = tuple(token_ids[position:position + count])
            position += count
            updates = self._live.get(request_id)
            if updates is None:
                continue  # aborted here since
            if errors and index in errors:
                error = errors[index]
                del self._live[request_id]
                updates.put(UpstreamError(_STATUS_BY_NUMBER.get(error.code, grpc.StatusCode.UNKNOWN),
                                          f"verifier {self.address}: {error.message}"))
                continue
            if finish_reason:
                del self._live[request_id]
            updates.put(VerifierChunk(tokens, finish_reason, Usage(*usage),
                                      _logprobs(response, index) if has_logprobs else (), seeds.get(index)))


def _logprobs(response: verifier_pb2.ServeResponse, index: int) -> tuple[TokenLogprobs, ...]:
    if index not in response.logprobs:
        return ()
    return tuple(TokenLogprobs(entry.chosen.token_id, entry.chosen.logprob,
                               tuple((top.token_id, top.logprob) for top in entry.top))
                 for entry in response.logprobs[index].entries)


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
