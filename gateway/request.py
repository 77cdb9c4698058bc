"""The gateway's domain types: a validated request, and what flows back from a verifier to a client.

They know nothing of protobuf or HTTP; gateway/convert.py and gateway/openai/http.py translate at the edges.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specd.sampling import SamplingParams

FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation request, tokenized and with every default filled in: the prompt, the stop
    strings (the gateway's alone to match) and the sampling parameters the verifier gets (specd/sampling.py)."""

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    stop: tuple[str, ...] = ()

    def with_sampling(self, **changes) -> GenerationRequest:
        """This request with `changes` to its sampling parameters (a sample's seed, a resume's offset)."""
        return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, **changes))


@dataclass
class Usage:
    """Per-request counts (docs/PUBLIC_SURFACE.md): steps counts the forward passes that emitted tokens."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    num_speculative_tokens: int = 0  # draft slots per step the verifier gave the request (its k, clamped)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus_generated(self, other: Usage) -> Usage:
        """These counts with other's generated ones added (completion, drafts, accepted, steps); the prompt and
        k stay these: a stream's parts across a resume, or the samples of one request (gateway/openai/choices.py)."""
        return dataclasses.replace(self, completion_tokens=self.completion_tokens + other.completion_tokens,
                                   draft_tokens=self.draft_tokens + other.draft_tokens,
                                   accepted_tokens=self.accepted_tokens + other.accepted_tokens,
                                   steps=self.steps + other.steps)


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's logprob and the most likely tokens at its position, as a verifier sends them."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(slots=True)  # not frozen: a frozen dataclass is built 4x slower, and one is built per request per step
class VerifierChunk:
    """One message of a verifier stream: the tokens accepted in one step; the last one finishes it."""

    token_ids: tuple[int, ...]
    finish_reason: str = ""  # "" until the last message
    usage: Usage | None = None  # on the last message only
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token when the request asked for logprobs
    seed: int | None = None  # the seed the request samples with, on the first message (None: greedy, unseeded)

    def then(self, later: VerifierChunk) -> VerifierChunk:
        """This message and the one after it as one."""
        return VerifierChunk(self.token_ids + later.token_ids, later.finish_reason, later.usage or self.usage,
                             self.logprobs + later.logprobs, self.seed if self.seed is not None else later.seed)


@dataclass(frozen=True)
class TokenCandidate:
    """A token with its logprob and its text, as clients see it."""

    token_id: int
    logprob: float
    text: str  # a part of a character reads as U+FFFD here ...
    utf8: bytes  # ... and exactly here


@dataclass(frozen=True)
class SentLogprobs:
    """The logprobs of a token whose text has been sent: the token and the most likely ones at its position."""

    chosen: TokenCandidate
    top: tuple[TokenCandidate, ...]
    text_offset: int  # where its text starts in the generated text (characters)


@dataclass
class TextChunk:
    """One message to a client: new text and ids; the last one carries finish_reason and usage."""

    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: str = ""
    usage: Usage | None = None
    logprobs: list[SentLogprobs] | None = None  # the tokens whose text this chunk sends; None: not asked
    seed: int | None = None  # on the first message: the seed that reproduces the text (None: greedy, unseeded)
    index: int = 0  # which of an HTTP request's samples (its choice index: gateway/openai/choices.py)


@dataclass(frozen=True)
class ReplicaLoad:
    """A verifier replica's load report, as the router uses it."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    model: str = ""
    max_model_len: int = 0  # 0 = not reported
    serve_port: int = 0  # the replica's Serve socket (0: it has none)
