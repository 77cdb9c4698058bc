"""specd.v1.Drafter: a thin servicer over DrafterSession (one session per stream)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from drafter_service import convert
from drafter_service.drafter import Drafter
from drafter_service.metrics import StepStats
from specd.v1 import drafter_pb2, drafter_pb2_grpc


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    """Answers every ProposeRequest of a stream with one ProposeResponse, in order."""

    def __init__(self, drafter: Drafter, on_step: Callable[[StepStats], None],
                 inject_delay_seconds: float = 0.0) -> None:
        """`inject_delay_seconds` is a testing aid: every reply waits this long (a slow drafter)."""
        self._drafter = drafter
        self._on_step = on_step
        self._inject_delay_seconds = inject_delay_seconds

    async def Propose(self, request_iterator: AsyncIterator[drafter_pb2.ProposeRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[drafter_pb2.ProposeResponse]:
        session = self._drafter.open_session()
        try:
            async for request in request_iterator:
                started = time.perf_counter()
                drafts = session.step(convert.batch_from_pb(request))
                response = convert.drafts_to_pb(drafts)
                store = self._drafter.store
                from_memory = drafts.memory_draft_tokens
                self._on_step(StepStats(seconds=time.perf_counter() - started,
                                        num_sequences=len(drafts.draft_counts),
                                        proposed_tokens=(drafts.num_proposed_tokens - from_memory, from_memory),
                                        draft_lengths=drafts.draft_length_counts, sequences_held=len(store),
                                        memory_tokens=store.memory_tokens))
                if self._inject_delay_seconds:
                    await asyncio.sleep(self._inject_delay_seconds)
                yield response
        finally:
            session.close()  # the verifier re-syncs every sequence on its next stream
