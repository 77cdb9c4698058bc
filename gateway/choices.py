"""OpenAI's `n`: n generations of one prompt, their chunks merged in the order they arrive.

Choice i of a seeded request runs with seed + i, so each choice can be reproduced alone (`n: 1` with that
seed). A sampled request without a seed draws one here (for n = 1 the verifier draws it), so that the one
seed the response reports - choice 0's - reproduces every choice. Choice 0 starts first and the others once its
first chunk has arrived: the prompt's KV blocks are then in the verifier's prefix cache, so the other n - 1
skip its prefill (when the router sends them to the same replica, as it does with one replica).
"""
from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing

from gateway.request import GenerationRequest, TextChunk, Usage

MAX_CHOICES = 128  # OpenAI's limit

_DONE = object()  # a choice's pump puts this after its last chunk


def choice_requests(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The n requests: choice i with seed + i (wrapping inside [0, 2**63)); greedy ones need no seed."""
    if request.seed is None and request.temperature == 0:
        return [request] * n
    seed = secrets.randbits(63) if request.seed is None else request.seed
    return [dataclasses.replace(request, seed=(seed + i) % 2**63) for i in range(n)]


async def merged_choices(pipeline, request: GenerationRequest, n: int,
                         deadline: float | None) -> AsyncIterator[tuple[int, TextChunk]]:
    """(choice index, chunk) as they come; every choice's last chunk has its finish_reason. An error of any
    choice ends them all (closing the iterator cancels every verifier call)."""
    requests = choice_requests(request, n)
    arrivals: asyncio.Queue = asyncio.Queue()
    first_arrived = asyncio.Event()

    async def pump(index: int) -> None:
        try:
            async with aclosing(pipeline.generate(requests[index], deadline)) as chunks:
                async for chunk in chunks:
                    first_arrived.set()
                    arrivals.put_nowait((index, chunk))
            arrivals.put_nowait((index, _DONE))
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
            arrivals.put_nowait((index, error))

    async def start_the_rest() -> None:
        await first_arrived.wait()
        tasks.extend(asyncio.ensure_future(pump(i)) for i in range(1, n))

    tasks = [asyncio.ensure_future(pump(0))]
    starter = asyncio.ensure_future(start_the_rest())
    try:
        remaining = n
        while remaining:
            index, item = await arrivals.get()
            if item is _DONE:
                remaining -= 1
                first_arrived.set()  # a choice 0 that ended without a chunk must not hold the others back
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        starter.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(starter, *tasks, return_exceptions=True)


def summed_usage(usages: list[Usage]) -> Usage:
    """One response's usage for its choices: the prompt once, everything generated summed."""
    return Usage(prompt_tokens=usages[0].prompt_tokens,
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 draft_tokens=sum(u.draft_tokens for u in usages),
                 accepted_tokens=sum(u.accepted_tokens for u in usages),
                 steps=sum(u.steps for u in usages),
                 num_speculative_tokens=max(u.num_speculative_tokens for u in usages))
