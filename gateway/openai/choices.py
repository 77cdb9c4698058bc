"""`n` and `best_of`: several independent samples of one prompt in one HTTP response, as OpenAI returns them.

Sample i is the request with seed + i, so any choice can be reproduced alone (`n: 1` with that seed). A
sampled request without a seed and more than one sample draws one here (for one sample the verifier draws
it), so that the one seed the response reports - sample 0's - reproduces every choice; greedy samples need
none. The first sample runs alone until its first token: by then its prompt's KV blocks are in the prefix
cache of its verifier replica, and the others, pinned to that replica (router.ReplicaPin), start from them
instead of computing the prompt again. Chunks of all samples stream as they come, each with its choice's
index. best_of generates best_of samples and returns the n with the highest cumulative logprob (the sum of
the logprobs of the tokens sent, from the distribution logprobs_mode names), most likely first; it cannot
stream. Usage counts the prompt once and every token generated, those of discarded samples included.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.request import GenerationRequest, SentLogprobs, TextChunk, Usage
from gateway.router import ReplicaPin

if TYPE_CHECKING:
    from gateway.pipeline import Pipeline

MAX_CHOICES = 128  # samples one request may ask for (n, best_of), OpenAI's limit; each costs a request's work
_SEEDS = 2**63  # seeds are in [0, 2**63): seed + i wraps around


def sample_requests(request: GenerationRequest, count: int) -> list[GenerationRequest]:
    """The request of each sample: seed + i, the seed drawn here for sampled requests without one (one
    sample alone is left to the verifier, which draws and reports it); greedy ones need no seed."""
    sampling = request.sampling
    if count == 1 or sampling.seed is None and sampling.greedy:
        return [request] * count
    seed = secrets.randbits(63) if sampling.seed is None else sampling.seed
    return [request.with_sampling(seed=(seed + i) % _SEEDS) for i in range(count)]


def interleaved(pipeline: Pipeline, requests: list[GenerationRequest],
                deadline: float | None) -> AsyncIterator[TextChunk]:
    """Every sample's chunks, each with its choice index, as they come, until all have finished; the first error
    raises. Closing it early cancels every sample (and its verifier call). One sample is the pipeline's own
    stream: no layer between it and the client on the path every streamed token takes."""
    if len(requests) == 1:
        return pipeline.generate(requests[0], deadline)
    return _samples(pipeline, requests, deadline)


async def _samples(pipeline: Pipeline, requests: list[GenerationRequest],
                   deadline: float | None) -> AsyncIterator[TextChunk]:
    arrivals: asyncio.Queue = asyncio.Queue()
    pin, prompt_cached = ReplicaPin(), asyncio.Event()

    async def sample(index: int, request: GenerationRequest) -> None:
        try:
            if index:
                await prompt_cached.wait()
            async with aclosing(pipeline.generate(request, deadline, pin)) as chunks:
                async for chunk in chunks:
                    prompt_cached.set()
                    chunk.index = index
                    arrivals.put_nowait(chunk)
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
            arrivals.put_nowait(error)
        finally:
            prompt_cached.set()  # the first sample failed before its first token: the others go anyway

    tasks = [asyncio.create_task(sample(i, request)) for i, request in enumerate(requests)]
    try:
        unfinished = len(requests)
        while unfinished:
            item = await arrivals.get()
            if isinstance(item, Exception):
                raise item
            yield item
            unfinished -= bool(item.finish_reason)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Choice:
    """One sample, collected: its text, how it ended, its counts, its logprobs (None: not asked) and its seed."""

    index: int
    pieces: list[str] = field(default_factory=list)  # its text, as it came
    finish_reason: str = ""
    usage: Usage | None = None
    logprobs: list[SentLogprobs] | None = None
    seed: int | None = None  # what it sampled with, from its first chunk (None: greedy, unseeded)

    def add(self, chunk: TextChunk) -> None:
        self.pieces.append(chunk.text)
        if chunk.seed is not None and self.seed is None:
            self.seed = chunk.seed
        if chunk.logprobs is not None:
            self.logprobs = self.logprobs if self.logprobs is not None else []
            self.logprobs += chunk.logprobs
        if chunk.finish_reason:
            self.finish_reason, self.usage = chunk.finish_reason, chunk.usage

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def cumulative_logprob(self) -> float:
        return sum(entry.chosen.logprob for entry in self.logprobs or ())


async def collect(chunks: AsyncIterator[TextChunk]) -> list[Choice]:
    """Every sample's choice, in index order."""
    choices: dict[int, Choice] = {}
    async for chunk in chunks:
        choices.setdefault(chunk.index, Choice(chunk.index)).add(chunk)
    return [choices[index] for index in sorted(choices)]


def best(choices: list[Choice], n: int, keep_logprobs: bool) -> list[Choice]:
    """The n choices with the highest cumulative logprob, most likely first, indexed 0..n - 1."""
    ranked = sorted(choices, key=lambda choice: choice.cumulative_logprob, reverse=True)[:n]
    return [dataclasses.replace(choice, index=index, logprobs=choice.logprobs if keep_logprobs else None)
            for index, choice in enumerate(ranked)]


def total_usage(usages: list[Usage]) -> Usage:
    """The samples' counts together: the prompt once, generated tokens, drafts and steps summed (so
    completion_tokens / steps stays the mean acceptance length)."""
    total = functools.reduce(Usage.plus_generated, usages)
    return dataclasses.replace(total, num_speculative_tokens=max(u.num_speculative_tokens for u in usages))
