"""Per-request sampling parameters, validated once when the request enters the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

from specd.float32 import as_float32

MAX_LOGPROBS = 20  # most likely alternatives a request may ask for per token (OpenAI's chat maximum)
LOGPROBS_MODES = ("raw", "processed")  # which distribution logprobs are taken from (engine/logprobs.py)


@dataclass(frozen=True)
class SamplingParams:
    """How a request chooses tokens and when it stops.

    temperature == 0 means greedy. Filters (top_k, top_p, min_p) apply only when sampling.
    num_speculative_tokens None means the engine's default; 0 turns speculation off for the request.
    logprobs None means none; N in 0..MAX_LOGPROBS: each emitted token's log-probability and the N most
    likely tokens at its position, from the raw or the processed distribution (logprobs_mode, see logprobs.py).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    num_speculative_tokens: int | None = None
    # n-gram bounds for the drafter; 0 = the drafter's defaults.
    min_ngram: int = 0
    max_ngram: int = 0
    tenant_key: str = ""  # for the drafter's per-key memory scope (gateway/tenant.py); "" = no tenant
    logprobs: int | None = None
    logprobs_mode: str = "raw"

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.temperature >= 0.0, "temperature", "must be >= 0"),
            # Checked as the float32 it is sampled with: 1e-46 > 0, but in float32 it is 0 and keeps no token.
            (0.0 < as_float32(self.top_p) <= 1.0, "top_p", "must be in (0, 1] as a 32-bit float"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 = off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.num_speculative_tokens is None or self.num_speculative_tokens >= 0,
             "num_speculative_tokens", "must be >= 0"),
            (self.min_ngram >= 0 and self.max_ngram >= 0, "min_ngram", "n-gram bounds must be >= 0"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"must be in [0, {MAX_LOGPROBS}] (or unset for none)"),
            (self.logprobs_mode in LOGPROBS_MODES, "logprobs_mode", f"must be one of {', '.join(LOGPROBS_MODES)}"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise InvalidParameter(name, message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class InvalidParameter(ValueError):
    """A request field has a bad value; `field` names it (mapped to INVALID_ARGUMENT / HTTP 400)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
