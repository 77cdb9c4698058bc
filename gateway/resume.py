"""Carrying a stream over to another verifier replica when its own fails mid-way.

The gateway remembers the tokens a stream has emitted. If its verifier fails (UNAVAILABLE, e.g. the
process died), the request is sent to another replica with the prompt plus those tokens as its
prompt and the remaining max_tokens, and the stream goes on from there. The resumed request keeps the
seed the first verifier reported (its own, or the one drawn for it) and says how many of its prompt's
tokens were generated (output_position_offset), so sampling goes on at the same output positions with
the same keyed randomness: the output is identical to an uninterrupted run, sampled or greedy. Usage is
merged so the client sees one request's counts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gateway.request import GenerationRequest, Usage, VerifierChunk


@dataclass
class StreamProgress:
    """What one request has emitted so far, across the replicas that served it."""

    request: GenerationRequest
    emitted: list[int] = field(default_factory=list)
    steps: int = 0
    accepted_tokens: int = 0
    carried: Usage = field(default_factory=Usage)  # counts of earlier attempts (all zero before a resume)
    last_usage: Usage | None = None  # the latest counts sent (merged), exact where verifiers send them
    seed: int | None = None  # the seed the verifier reported: the resumed request samples with it too

    def record(self, chunk: VerifierChunk) -> VerifierChunk:
        """Notes the chunk's tokens; returns it with usage merged over every attempt."""
        if chunk.seed is not None:
            self.seed = chunk.seed
        if chunk.token_ids:
            self.emitted += chunk.token_ids
            self.steps += 1
            self.accepted_tokens += len(chunk.token_ids) - 1  # each step emits one token of its own
        if chunk.usage is None or not self.emitted_before_resume:
            self.last_usage = chunk.usage or self.last_usage
            return chunk
        merged = dataclasses.replace(chunk.usage.plus_generated(self.carried),
                                     prompt_tokens=len(self.request.prompt_token_ids))
        self.last_usage = merged
        return dataclasses.replace(chunk, usage=merged)

    @property
    def emitted_before_resume(self) -> int:
        return self.carried.completion_tokens

    def resume(self) -> GenerationRequest | None:
        """The request that continues this stream elsewhere; None when nothing is left to generate."""
        remaining = self.request.sampling.max_tokens - len(self.emitted)
        if remaining < 1:
            return None
        if self.last_usage is not None and self.last_usage.completion_tokens == len(self.emitted):
            last = self.last_usage
            self.carried = Usage(completion_tokens=len(self.emitted), draft_tokens=last.draft_tokens,
                                 accepted_tokens=last.accepted_tokens, steps=last.steps)
        else:  # counts not sent with the last tokens: accepted ones bound the drafts scored from below
            self.carried = Usage(completion_tokens=len(self.emitted), draft_tokens=self.accepted_tokens,
                                 accepted_tokens=self.accepted_tokens, steps=self.steps)
        sampling = dataclasses.replace(self.request.sampling, max_tokens=remaining,
                                       seed=self.request.sampling.seed if self.seed is None else self.seed,
                                       output_position_offset=len(self.emitted))
        return dataclasses.replace(self.request, sampling=sampling,
                                   prompt_token_ids=self.request.prompt_token_ids + tuple(self.emitted))
