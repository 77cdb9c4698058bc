"""A minimal real specd.v1.Verifier server for gateway routing tests: it streams scripted tokens.

It runs a real grpc.aio server on loopback (health, reflection and all, via specd.serving) but no
model: each Generate streams `tokens` a few per step (with made-up logprobs when asked, scripted_logprobs),
and reports the request's seed on the first message as the real verifier does (`drawn_seed` for a sampled
request without one). It records what reached it (requests, their
deadlines, cancellations) so tests can check routing, failover and cancel propagation. End-to-end
tests with the real verifier live in tests/e2e/.
"""
from __future__ import annotations

import asyncio

import grpc

from specd.serving import GrpcServer, ServerConfig
from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.serve_socket import ServeSocket


class ScriptedVerifier(verifier_pb2_grpc.VerifierServicer):
    """Streams `tokens` (truncated to max_tokens) `tokens_per_step` at a time, then finishes."""

    def __init__(self, tokens: list[int], tokens_per_step: int = 2, model: str = "scripted",
                 max_model_len: int = 2048, serve_socket: bool = False) -> None:
        """serve_socket: also serve a Serve socket (verifier_service/serve_socket.py), named in the load report."""
        self.tokens = tokens
        self.with_serve_socket = serve_socket
        self.serve_port = 0  # reported in GetLoad: the Serve socket's, or a test's
        self.serve_socket = None
        self.tokens_per_step = tokens_per_step
        self.model = model
        self.max_model_len = max_model_len
        self.reported_running = 0  # added to live requests in the load report
        self.fail_with: grpc.StatusCode | None = None  # abort every call before its first token
        self.hold_after_steps: int | None = None  # stop streaming after this many steps, until cancelled
        self.step_seconds = 0.0  # each step's time (0: as fast as the loop goes, steps may pile up)
        self.drawn_seed = 4242  # the "random" seed of a sampled request that came without one
        self.requests: list[verifier_pb2.VerifierGenerateRequest] = []
        self.time_remaining: list[float | None] = []
        self.cancelled = asyncio.Event()
        self.live = 0
        self.server: GrpcServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def start(self) -> "ScriptedVerifier":
        self.server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_seconds=0),
                                 service_names=["specd.v1.Verifier"],
                                 register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(self, s))
        await self.server.start()
        if self.with_serve_socket:
            self.serve_socket = await ServeSocket(lambda messages: self.Serve(messages, None)).start(
                "127.0.0.1", 0, None)
            self.serve_port = self.serve_socket.port
        await self.server.mark_ready()
        return self

    async def stop(self) -> None:
        if self.serve_socket is not None:
            self.serve_socket.close()
        await self.server.stop(0)

    async def Generate(self, request, context):
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        if self.fail_with is not None:
            await context.abort(self.fail_with, "scripted failure")
        self.live += 1
        try:
            async for message in self._steps(request):
                yield message
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.live -= 1

    async def _steps(self, request):
        tokens = self.tokens[:request.sampling.max_tokens]
        finish_reason = "length" if len(tokens) < len(self.tokens) else "stop"
        steps = [tokens[i:i + self.tokens_per_step] for i in range(0, len(tokens), self.tokens_per_step)]
        sampling = request.sampling  # k as a verifier with default 4 and maximum 8 reports it
        asked_k = sampling.num_speculative_tokens if sampling.HasField("num_speculative_tokens") else None
        seed = sampling.seed if sampling.HasField("seed") else self.drawn_seed if sampling.temperature > 0 else None
        for index, step in enumerate(steps):
            if self.hold_after_steps is not None and index == self.hold_after_steps:
                await asyncio.Event().wait()  # until the call is cancelled
            last = index == len(steps) - 1
            sent, done = sum(len(s) for s in steps[:index + 1]), index + 1  # counts so far, totals on the last
            usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids),
                                     completion_tokens=sent, draft_tokens=2 * done,
                                     accepted_tokens=sent - done, steps=done,
                                     num_speculative_tokens=min(asked_k, 8) if asked_k is not None else 4)
            first = index * self.tokens_per_step
            logprobs_seed = sampling.seed if sampling.HasField("seed") else 0
            logprobs = ([scripted_logprobs(first + i, token, sampling.logprobs, logprobs_seed)
                         for i, token in enumerate(step)] if sampling.HasField("logprobs") else None)
            yield verifier_pb2.VerifierGenerateResponse(
                token_ids=step, finish_reason=finish_reason if last else "", usage=usage,
                logprobs=logprobs, seed=seed if index == 0 else None)
            await asyncio.sleep(self.step_seconds)  # let cancellations in between steps, as a real engine would

    async def Serve(self, request_iterator, context):
        """The gateway's way in: each start runs as Generate would, its messages sent in columns."""
        outbox: asyncio.Queue = asyncio.Queue()  # (request_id, VerifierGenerateResponse | None, error code | None)
        tasks: dict[str, asyncio.Task] = {}

        async def run(start) -> None:
            request = start.request
            self.requests.append(request)
            self.time_remaining.append(start.timeout_seconds or None)
            if self.fail_with is not None:
                outbox.put_nowait((request.request_id, None, self.fail_with))
                return
            self.live += 1
            try:
                async for message in self._steps(request):
                    outbox.put_nowait((request.request_id, message, None))
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            finally:
                self.live -= 1

        async def read() -> None:
            async for message in request_iterator:
                for start in message.starts:
                    tasks[start.request.request_id] = asyncio.create_task(run(start))
                for request_id in message.abort_request_ids:
                    if request_id in tasks:
                        tasks.pop(request_id).cancel()

        reader = asyncio.create_task(read())
        try:
            while True:
                items = [await outbox.get()]
                while not outbox.empty():
                    items.append(outbox.get_nowait())
                yield _columns(items)
        finally:
            reader.cancel()
            for task in tasks.values():
                task.cancel()

    async def GetLoad(self, request, context):
        return verifier_pb2.LoadReport(num_running=self.live + self.reported_running, num_waiting=0,
                                       kv_cache_usage=0.0, model=self.model,
                                       max_model_len=self.max_model_len, serve_port=self.serve_port)


def _columns(items) -> verifier_pb2.ServeResponse:
    """A ServeResponse of (request id, Generate's message or None, grpc status code or None) items."""
    response = verifier_pb2.ServeResponse()
    for index, (request_id, message, code) in enumerate(items):
        response.request_ids.append(request_id)
        if code is not None:
            response.errors[index].CopyFrom(verifier_pb2.RequestError(code=code.value[0], message="scripted failure"))
            message = verifier_pb2.VerifierGenerateResponse()
        response.token_counts.append(len(message.token_ids))
        response.token_ids.extend(message.token_ids)
        response.finish_reasons.append(message.finish_reason)
        usage = message.usage
        for field in ("prompt_tokens", "completion_tokens", "draft_tokens", "accepted_tokens", "steps",
                      "num_speculative_tokens"):
            getattr(response, field).append(getattr(usage, field))
        if message.HasField("seed"):
            response.seeds[index] = message.seed
        if message.logprobs:
            response.logprobs[index].entries.extend(message.logprobs)
    return response


def scripted_logprobs(position: int, token_id: int, num_top: int, seed: int = 0) -> common_pb2.TokenLogprobs:
    """The logprobs the scripted verifier reports for output position `position`: the token is the most likely
    one at -(position + 1) / 8 - (seed % 4) / 4, then made-up ids 1000, 1001, ... one nat apart."""
    logprob = -(position + 1) / 8 - (seed % 4) / 4
    top = [(token_id, logprob)] + [(1000 + j, logprob - j - 1) for j in range(num_top - 1)]
    return common_pb2.TokenLogprobs(chosen=common_pb2.TokenLogprob(token_id=token_id, logprob=logprob),
                                    top=[common_pb2.TokenLogprob(token_id=t, logprob=v) for t, v in top[:num_top]])
