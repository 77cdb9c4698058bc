"""When to ask for drafts: speculation must never cost much throughput.

A decode / verify step is padded to one width for the whole batch (a captured CUDA graph of k + 1
tokens per sequence), so one request with drafts makes every sequence in the step score k + 1
tokens. Drafts that are rejected buy nothing for that cost. Two rules keep it small:

- Per request, exponential backoff: each scored draft updates an acceptance EMA (accepted / drafted).
  While it is below `min_acceptance`, the request drafts again (probes) only at the next multiple of
  its backoff period on the engine's step clock; the period doubles on every failed probe (2, 4 ...
  `max_backoff` steps) and resets once a probe lifts the EMA again. Aligned to the clock, requests
  with the same period probe in the same step: one padded step for all of them, not one each.
- Per step, batch size: with more than `max_batch_size` running requests the step is compute-bound
  (every padded token costs about as much as a real one), so no request drafts in it.

Drafts never change what is emitted (greedy stays token-for-token identical, sampling keeps the target
distribution), so neither rule can change output; they only choose which steps score drafts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftPolicyConfig:
    min_acceptance: float = 0.3  # acceptance EMA below this backs a request off
    smoothing: float = 0.5  # weight of the newest step in the EMA
    max_backoff: int = 64  # steps; the longest pause between probes
    max_batch_size: int = 32  # no drafting in steps with more running requests (0 = no limit)

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError(f"min_acceptance: {self.min_acceptance} must be in [0, 1]")
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"smoothing: {self.smoothing} must be in (0, 1]")
        if self.max_backoff < 1:
            raise ValueError(f"max_backoff: {self.max_backoff} must be >= 1")
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size: {self.max_batch_size} must be >= 0 (0 = no limit)")


class DraftBackoff:
    """One request's drafting state: acceptance EMA, current backoff, and the step it may draft again."""

    __slots__ = ("acceptance", "backoff", "resume_step")

    def __init__(self) -> None:
        self.acceptance = 1.0  # optimistic: a new request drafts until its drafts fail
        self.backoff = 0  # steps skipped after the last failed probe (0 = not backed off)
        self.resume_step = 0


class DraftPolicy:
    """Decides, per step and request, whether to reserve draft slots (see the module docstring)."""

    def __init__(self, config: DraftPolicyConfig | None = None) -> None:
        self.config = config or DraftPolicyConfig()
        self.step = 0  # the engine's step clock, advanced by begin_step
        self.step_allows_drafts = True
        self.num_skipped = 0  # request-steps that could have drafted but were held back (since start)

    def begin_step(self, num_running: int) -> None:
        """Called once per schedule(), before any request is planned; num_running = requests holding KV."""
        self.step += 1
        self.step_allows_drafts = self.batch_allows_drafts(num_running)

    def batch_allows_drafts(self, num_running: int) -> bool:
        """The per-step rule: no drafting with more than max_batch_size running requests (0 = no limit)."""
        limit = self.config.max_batch_size
        return limit == 0 or num_running <= limit

    def allows(self, state: DraftBackoff) -> bool:
        """Whether a decoding request with this state may draft in the current step (counts refusals)."""
        if self.step_allows_drafts and self.step >= state.resume_step:
            return True
        self.num_skipped += 1
        return False

    def may_allow_next(self, state: DraftBackoff, num_running: int) -> bool:
        """Whether the next step could let a request with this state draft (a pure check: counts nothing)."""
        return self.batch_allows_drafts(num_running) and self.step + 1 >= state.resume_step

    def observe(self, state: DraftBackoff, num_draft_tokens: int, num_accepted: int) -> None:
        """Feeds one verify result (a request that had drafts scored this step) into its state."""
        if num_draft_tokens <= 0:
            return  # the proposer had nothing: no evidence either way
        weight = self.config.smoothing
        state.acceptance = (1.0 - weight) * state.acceptance + weight * num_accepted / num_draft_tokens
        if state.acceptance >= self.config.min_acceptance:
            state.backoff = 0
            return
        backoff = state.backoff = min(max(2, 2 * state.backoff), self.config.max_backoff)
        # The next probe is the next multiple of the period, where every request with that period probes.
        state.resume_step = (self.step // backoff + 1) * backoff
