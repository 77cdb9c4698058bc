"""What the engine hands back to its caller after each step."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class FinishReason(str, Enum):
    STOP = "stop"  # an EOS / stop token was generated
    LENGTH = "length"  # max_tokens or the model's context length was reached
    ABORT = "abort"  # the caller aborted the request


@dataclass(frozen=True)
class RequestUsage:
    prompt_tokens: int
    completion_tokens: int
    draft_tokens: int  # drafts scored for this request
    accepted_tokens: int  # drafts accepted (<= draft_tokens)
    steps: int  # forward passes that emitted tokens for this request (the prefill pass included)
    num_speculative_tokens: int = 0  # draft slots per step it ran with: its ask (or the default), clamped


@dataclass(frozen=True)
class TokenLogprobs:
    """The target model's log-probability of one emitted token, and the most likely tokens at its position
    (engine/logprobs.py says from which distribution)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first: the N the request asked for


@dataclass(frozen=True)
class RequestOutput:
    """Tokens one request gained in one step (1..k+1 of them; stop tokens included, nothing after them)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None  # set when the request finished this step
    usage: RequestUsage
    logprobs: list[TokenLogprobs] | None = None  # one per new token when the request asked for logprobs
    seed: int | None = None  # what its sampling is keyed by (its own, or drawn at arrival); None: greedy, unseeded

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot for routing and metrics."""

    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_total_blocks: int

    @property
    def kv_cache_usage(self) -> float:
        return self.num_used_blocks / self.num_total_blocks if self.num_total_blocks else 0.0
