"""The one schema of a request's sampling parameters: the fields, their types, defaults and bounds, and the
error a bad one raises. Torch-free, so the gateway, both converters and the engine share it; the protos are its
wire form (common.proto's SamplingParams, gateway.proto's GenerateRequest), pinned to it by
tests/test_sampling_schema.py.

Adding a field: declare it on SamplingParams (default = the neutral value, check in __post_init__) and in both
protos (CLIENT_FIELDS if a client sets it). Both converters map it by name, the gateway validates a client's
value with these checks (gateway/validation.py names the field as the client sent it) and the OpenAI body takes
it with its type from here (gateway/openai/schema.py).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from specd.float32 import as_float32


class InvalidParameter(ValueError):
    """A request field has a bad value; `field` names it (mapped to INVALID_ARGUMENT / HTTP 400)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self):  # crosses the engine process's pipe
        return InvalidParameter, (self.field, self.message)


MAX_LOGPROBS = 20  # most likely alternatives a request may ask for per token (OpenAI's chat maximum)
LOGPROBS_MODES = ("raw", "processed")  # which distribution logprobs are taken from (engine/logprobs.py)
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's cap on logit_bias
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty and frequency_penalty, as OpenAI's
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # each logit_bias entry's bias, as OpenAI's
SEED_LIMIT = 2**64  # seeds are in [0, SEED_LIMIT) (uint64 on the verifier's wire)
INT32_MAX = 2**31 - 1  # top_k and num_speculative_tokens are int32 on the wire


@dataclass(frozen=True)
class SamplingParams:
    """How a request chooses tokens and when it stops.

    temperature == 0 means greedy. Filters (top_k, top_p, min_p) apply only when sampling.
    num_speculative_tokens None means the engine's default; 0 turns speculation off for the request.
    logprobs None means none; N in 0..MAX_LOGPROBS: each emitted token's log-probability and the N most
    likely tokens at its position, from the raw or the processed distribution (logprobs_mode, see logprobs.py).
    seed keys the sampler's randomness (keyed_noise.py), None = a random seed drawn at arrival.
    output_position_offset: generated tokens the prompt ends with (a stream resumed on another verifier carries
    its output so far in the prompt), so that the position keying each sampled token counts them too.
    Penalties and logit_bias (token id -> bias added to its logit) adjust the logits before all of that, in
    greedy and sampled requests alike (logits_processors.py defines them); the neutral values cost nothing.
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
    output_position_offset: int = 0
    presence_penalty: float = 0.0  # in [-2, 2]; 0 = off
    frequency_penalty: float = 0.0  # in [-2, 2]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> bias in [-100, 100]

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.temperature >= 0.0, "temperature", "must be >= 0"),
            # Checked as the float32 it is sampled with: 1e-46 > 0, but in float32 it is 0 and keeps no token.
            (0.0 < as_float32(self.top_p) <= 1.0, "top_p", "must be in (0, 1] as a 32-bit float"),
            (0 <= self.top_k <= INT32_MAX, "top_k", f"must be in [0, {INT32_MAX}] (0 = off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.num_speculative_tokens is None or 0 <= self.num_speculative_tokens <= INT32_MAX,
             "num_speculative_tokens", f"must be in [0, {INT32_MAX}] (0 = speculation off)"),
            (self.min_ngram >= 0 and self.max_ngram >= 0, "min_ngram", "n-gram bounds must be >= 0"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"must be in [0, {MAX_LOGPROBS}] (or unset for none)"),
            (self.logprobs_mode in LOGPROBS_MODES, "logprobs_mode", f"must be one of {', '.join(LOGPROBS_MODES)}"),
            (self.seed is None or 0 <= self.seed < SEED_LIMIT, "seed", "must be in [0, 2**64)"),
            (self.output_position_offset >= 0, "output_position_offset", "must be >= 0"),
        ]
        checks += [
            (in_range(self.presence_penalty, PENALTY_RANGE), "presence_penalty", "must be in [-2, 2]"),
            (in_range(self.frequency_penalty, PENALTY_RANGE), "frequency_penalty", "must be in [-2, 2]"),
            (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0, "repetition_penalty",
             "must be a finite number > 0 (1 = off)"),
            (len(self.logit_bias) <= MAX_LOGIT_BIAS_ENTRIES, "logit_bias",
             f"at most {MAX_LOGIT_BIAS_ENTRIES} entries"),
        ]
        checks += [(isinstance(token, int) and token >= 0 and in_range(bias, LOGIT_BIAS_RANGE),
                    f"logit_bias[{token}]", "must map a token id >= 0 to a bias in [-100, 100]")
                   for token, bias in self.logit_bias.items()]
        for ok, name, message in checks:
            if not ok:
                raise InvalidParameter(name, message)
        object.__setattr__(self, "logit_bias", dict(self.logit_bias))  # its own copy: the caller's may change

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    # Asked of every request at every step (engine._score_greedy, LogitsProcessorInputs.build): worked out once.
    @functools.cached_property
    def penalizes(self) -> bool:
        """Whether a penalty applies: the logits depend on the tokens so far (prompt and output)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @functools.cached_property
    def target(self) -> tuple[float, int, float, float]:
        """(temperature, top_k, top_p, min_p) of the distribution a row is judged on (SamplingMetadata) and its
        processed logprobs taken from: a greedy request takes the argmax of the unfiltered logits, temperature 1."""
        return (1.0, 0, 1.0, 0.0) if self.greedy else (self.temperature, self.top_k, self.top_p, self.min_p)

    @functools.cached_property
    def adjusts_logits(self) -> bool:
        """Whether a penalty or a logit bias changes the target's logits (logits_processors.py)."""
        return self.penalizes or bool(self.logit_bias)

    def check_vocabulary(self, vocab_size: int) -> None:
        """InvalidParameter naming the first logit_bias token outside [0, vocab_size)."""
        for token in self.logit_bias:
            if token >= vocab_size:
                raise InvalidParameter(f"logit_bias[{token}]", f"token id outside the vocabulary [0, {vocab_size})")


def in_range(value: float, bounds: tuple[float, float]) -> bool:
    """Whether `value` lies in the closed interval `bounds`."""
    return bounds[0] <= value <= bounds[1]


# Which messages carry which fields (tests/test_protos.py pins them): every field but these is in common.proto's
# SamplingParams; a client sets those of CLIENT_FIELDS (gateway.proto's GenerateRequest, the HTTP body).
ENGINE_ONLY_FIELDS = ("min_ngram", "max_ngram")  # set in-process (benchmarks, tests), never on the wire
REQUEST_FIELDS = ("tenant_key",)  # on VerifierGenerateRequest beside its SamplingParams: who the request is for
WIRE_FIELDS = tuple(name for name in SamplingParams.__dataclass_fields__
                    if name not in ENGINE_ONLY_FIELDS + REQUEST_FIELDS)  # common.proto's SamplingParams
CLIENT_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "num_speculative_tokens",
                 "logprobs", "logprobs_mode", "presence_penalty", "frequency_penalty", "repetition_penalty",
                 "logit_bias")
