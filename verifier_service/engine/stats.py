"""Plain counting objects the engine step fills; exporters (Prometheus, benchmarks) read them later.

Nothing here knows about Prometheus: the verifier's metrics exporter drains `Engine.take_step_stats()`.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import TypeVar

STAGES = ("schedule", "propose", "score", "verify", "update")


@dataclass
class SpecDecodingStats:
    """Speculation counts of one step (vLLM's SpecDecodingStats)."""

    num_drafts: int = 0  # requests that had at least one draft scored
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # tokens emitted by requests with drafts: accepted + recovered / bonus
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # index = draft position

    def observe(self, num_draft_tokens: int, num_accepted: int, num_emitted: int) -> None:
        """One request's verify result (called only for requests that had drafts)."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.num_emitted_tokens += num_emitted
        if len(self.num_accepted_tokens_per_pos) < num_draft_tokens:
            self.num_accepted_tokens_per_pos += [0] * (num_draft_tokens - len(self.num_accepted_tokens_per_pos))
        for position in range(num_accepted):
            self.num_accepted_tokens_per_pos[position] += 1


@dataclass
class StepStats:
    """What one engine step did and how long each stage took."""

    stage_seconds: dict[str, float] = field(default_factory=dict)  # schedule / propose / score / verify / update
    seconds: float = 0.0  # the whole step, whatever its stages
    forward_tokens: list[int] = field(default_factory=list)  # tokens fed to each forward this step launched
    num_prompt_tokens: int = 0  # of those, the ones beyond each request's one token and its drafts: prompt chunks'
    num_graph_replays: int = 0  # of those forwards, the ones replayed from a decode / verify step's CUDA graph
    num_piecewise_replays: int = 0  # and the ones replayed from the model's captured pieces (piecewise_graphs.py)
    num_output_tokens: int = 0  # tokens emitted to callers
    spec_decoding: SpecDecodingStats | None = None  # None when no request had drafts
    num_preemptions: int = 0
    num_running: int = 0  # after the step
    num_waiting: int = 0
    num_proposer_failures: int = 0  # the proposer raised; the step decoded without drafts
    num_draft_skips: int = 0  # decoding requests the draft policy kept from drafting this step
    scheduled_ahead: bool = False  # launched the next step before its own tokens reached the host

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the model (prompt chunks + last tokens + drafts). A step that is the first to
        launch the next one ahead launches two forwards (its own and the next); later steps launch one."""
        return sum(self.forward_tokens)


class StepStatsLog:
    """Recent steps' stats, drained by an exporter; bounded so an absent exporter costs no memory."""

    def __init__(self, max_steps: int = 4096) -> None:
        self._steps: deque[StepStats] = deque(maxlen=max_steps)
        self.current = StepStats()
        self._began = time.perf_counter()

    def begin(self) -> StepStats:
        self.current = StepStats()
        self._began = time.perf_counter()
        return self.current

    def end(self) -> None:
        self.current.seconds = time.perf_counter() - self._began
        self._steps.append(self.current)

    def take(self) -> list[StepStats]:
        """Steps finished since the last call, oldest first."""
        steps = []
        while self._steps:
            steps.append(self._steps.popleft())
        return steps


T = TypeVar("T")


def timed_stage(stage: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorates an engine method so its seconds add up in self.step_stats.current.stage_seconds[stage]."""

    def decorate(method: Callable[..., T]) -> Callable[..., T]:
        @wraps(method)
        def wrapper(self, *args, **kwargs) -> T:
            started = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                seconds = self.step_stats.current.stage_seconds
                seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started

        return wrapper

    return decorate


def count_spec_decoding(num_draft_tokens: Sequence[int], num_accepted: Sequence[int],
                        num_emitted: Sequence[int]) -> SpecDecodingStats | None:
    """Per-step speculation counts from per-request results; None when nothing was drafted."""
    stats = SpecDecodingStats()
    for drafts, accepted, emitted in zip(num_draft_tokens, num_accepted, num_emitted):
        if drafts:
            stats.observe(drafts, accepted, emitted)
    return stats if stats.num_drafts else None
