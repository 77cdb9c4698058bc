"""How many draft slots a step can afford: speculation must never cost much throughput.

A decode / verify step is padded to one width for the whole batch (a captured CUDA graph of width up to
k + 1 tokens per sequence), so one request with drafts makes every sequence in the step score that many
tokens. In a small batch the step reads its weights once whatever the width (memory-bound), so every
decoding request gets its k slots; with more than `max_batch_size` running requests the step is
compute-bound (every padded token costs about as much as a real one), so no request drafts in it.

Which of its slots a request fills is the drafter's call, from the evidence it has (match length, how often
a continuation followed): a request with no evidence gets no drafts and costs nothing. The engine no longer
backs requests off after rejections: at batch 1 that threw away acceptance, and the drafter knows better
than an acceptance average which drafts are worth scoring.

Drafts never change what is emitted (greedy stays token-for-token identical, sampling keeps the target
distribution), so this only chooses which steps score drafts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftPolicyConfig:
    max_batch_size: int = 32  # no drafting in steps with more running requests (0 = no limit)

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size: {self.max_batch_size} must be >= 0 (0 = no limit)")


class DraftPolicy:
    """Decides, per step, whether decoding requests get draft slots (see the module docstring)."""

    def __init__(self, config: DraftPolicyConfig | None = None) -> None:
        self.config = config or DraftPolicyConfig()
        self.num_skipped = 0  # request-steps of decoding requests with k > 0 held back (since start)

    def allows(self, num_running: int) -> bool:
        """Whether a decoding request may draft in a step with num_running requests (counts refusals)."""
        if self.batch_allows_drafts(num_running):
            return True
        self.num_skipped += 1
        return False

    def batch_allows_drafts(self, num_running: int) -> bool:
        """The per-step rule: no drafting with more than max_batch_size running requests (0 = no limit)."""
        limit = self.config.max_batch_size
        return limit == 0 or num_running <= limit
