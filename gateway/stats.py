"""Per-request timing and counts, filled in as a request runs; gateway/metrics.py exports them."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestStats:
    """What one request did; times are time.monotonic() seconds."""

    arrival_time: float = field(default_factory=time.monotonic)
    dispatch_time: float | None = None  # first verifier call started
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # One entry per token after the first: the gap before the step that carried it, split evenly
    # over that step's tokens (a speculative step emits several tokens at once).
    inter_token_latencies: list[float] = field(default_factory=list)
    finish_reason: str = ""
    error_code: str = ""  # grpc status name when the request failed

    def dispatched(self) -> None:
        if self.dispatch_time is None:
            self.dispatch_time = time.monotonic()

    def tokens_arrived(self, count: int) -> None:
        """Records one verifier step that carried `count` tokens."""
        if count == 0:
            return
        now = time.monotonic()
        if self.first_token_time is None:
            self.first_token_time = now
        else:
            gap = (now - self.last_token_time) / count
            self.inter_token_latencies.extend([gap] * count)
        self.completion_tokens += count
        self.last_token_time = now

    def finished(self, finish_reason: str = "", error_code: str = "") -> None:
        self.finish_time = time.monotonic()
        self.finish_reason = finish_reason
        self.error_code = error_code
