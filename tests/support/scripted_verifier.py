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


class ScriptedVerifier(verifier_pb2_grpc.VerifierServicer):
    """Streams `tokens` (truncated to max_tokens) `tokens_per_step` at a time, then finishes."""

    def __init__(self, tokens: list[int], tokens_per_step: int = 2, model: str = "scripted",
                 max_model_len: int = 2048) -> None:
        self.tokens = tokens
        self.tokens_per_step = tokens_per_step
        self.model = model
        self.max_model_len = max_model_len
        self.reported_running = 0  # added to live requests in the load report
        self.fail_with: grpc.StatusCode | None = None  # abort every call before its first token
        self.hold_after_steps: int | None = None  # stop streaming after this many steps, until cancelled
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
        await self.server.mark_ready()
        return self

    async def stop(self) -> None:
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
            usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids),
                                     completion_tokens=len(tokens), draft_tokens=2 * len(steps),
                                     accepted_tokens=len(tokens) - len(steps), steps=len(steps),
                                     num_speculative_tokens=min(asked_k, 8) if asked_k is not None else 4)
            first = index * self.tokens_per_step
            logprobs_seed = sampling.seed if sampling.HasField("seed") else 0
            logprobs = ([scripted_logprobs(first + i, token, sampling.logprobs, logprobs_seed)
                         for i, token in enumerate(step)] if sampling.HasField("logprobs") else None)
            yield verifier_pb2.VerifierGenerateResponse(
                token_ids=step, finish_reason=finish_reason if last else "", usage=usage if last else None,
                logprobs=logprobs, seed=seed if index == 0 else None)
            await asyncio.sleep(0)  # let cancellations in between steps, as a real engine would

    async def GetLoad(self, request, context):
        return verifier_pb2.LoadReport(num_running=self.live + self.reported_running, num_waiting=0,
                                       kv_cache_usage=0.0, model=self.model,
                                       max_model_len=self.max_model_len)


def scripted_logprobs(position: int, token_id: int, num_top: int, seed: int = 0) -> common_pb2.TokenLogprobs:
    """The logprobs the scripted verifier reports for output position `position`: the token is the most likely
    one at -(position + 1) / 8 - (seed % 4) / 4, then made-up ids 1000, 1001, ... one nat apart."""
    logprob = -(position + 1) / 8 - (seed % 4) / 4
    top = [(token_id, logprob)] + [(1000 + j, logprob - j - 1) for j in range(num_top - 1)]
    return common_pb2.TokenLogprobs(chosen=common_pb2.TokenLogprob(token_id=token_id, logprob=logprob),
                                    top=[common_pb2.TokenLogprob(token_id=t, logprob=v) for t, v in top[:num_top]])
