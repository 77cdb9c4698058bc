"""Drafts for a step launched before the previous step's tokens reach the host (async scheduling with drafts).

When step N + 1 is launched while step N still runs, the host does not know what N emits for a request:
its first a drafts (those that agree with the target) and then one token of the target's own, 1 to d + 1
tokens for d drafts. The guess of N's outcome follows from a proposal P, the proposer's guess of how the target
continues: N accepts the drafts that agree with P (a = the common prefix of P and N's drafts D) and then emits
P[a]; N + 1's drafts are what P says comes after that, P[a + 1 : a + 1 + k].

The proposer is never waited for: P is asked when step N is launched (Scheduler.lookahead_requests), on the context
known then (through step N - 2, with N - 1 still in flight), for (d' + 1) + (k + 1) + k tokens (d' = N - 1's
drafts; N's are at most k), and collected when N + 1 is launched. By then N - 1's tokens are known: they must be
P's first ones (continuations_after_known; otherwise P guessed N - 1 wrong and N + 1 gets no drafts), and the rest
of P is walked past N as above. A proposal not back by then costs N + 1 its drafts, not time.

For an n-gram proposer that follows a long match this is exactly the draft it would make once N's tokens
were known, and the drafter's round trip overlaps the device's step N instead of delaying step N + 1. When
N goes otherwise than guessed, N + 1's drafts are mostly rejected (N + 1 still emits the target's next
token) and the step after it guesses from N's real tokens. Drafts are only ever guesses: a wrong guess costs
acceptance, never correctness, since every draft is verified against the target.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.proposer import PendingProposal


@dataclass(frozen=True)
class AskedAhead:
    """A proposal asked before the step it serves was scheduled, and the context length of each request it was
    asked on."""

    pending: PendingProposal
    context_lens: dict[str, int]


def continuations_after_known(proposals: Mapping[str, Sequence[int]], context_lens: Mapping[str, int],
                              known: Mapping[str, tuple[Sequence[int], int]]) -> dict[str, list[int]]:
    """Each proposal (a guessed continuation of its request's context as it was when asked) cut to what it says
    follows the tokens known now (`known`: request id -> (its token ids, how many of them are known)). The tokens
    that became known since it was asked must be its first ones; where they are not, it guessed wrong: no entry."""
    continuations = {}
    for request_id, proposal in proposals.items():
        if request_id not in known or request_id not in context_lens:
            continue
        tokens, num_known = known[request_id]
        seen = list(tokens[context_lens[request_id]:num_known])
        if len(seen) < len(proposal) and list(proposal[:len(seen)]) == seen:
            continuations[request_id] = list(proposal[len(seen):])
    return continuations


def drafts_after(proposal: Sequence[int], in_flight_drafts: Sequence[int], num_slots: int) -> list[int]:
    """The drafts for the next step: what `proposal` says follows the in-flight step's guessed outcome."""
    agreed = 0
    for proposed, drafted in zip(proposal, in_flight_drafts):
        if proposed != drafted:
            break
        agreed += 1
    return list(proposal[agreed + 1:agreed + 1 + num_slots])


def guessed_drafts(batch: ScheduledBatch, in_flight: ScheduledBatch, proposals: Mapping[str, Sequence[int]],
                   slots: Mapping[str, int]) -> dict[str, list[int]]:
    """Drafts for each entry of batch that continues from in_flight (previous_token_row set), from its
    proposal and its drafts in flight; `slots`: draft slots per request id."""
    in_flight_by_id = {scheduled.request_id: scheduled for scheduled in in_flight.requests}
    drafts = {}
    for scheduled in batch.requests:
        proposal, num_slots = proposals.get(scheduled.request_id), slots.get(scheduled.request_id, 0)
        if not proposal or scheduled.previous_token_row < 0 or num_slots <= 0:
            continue
        previous = in_flight_by_id[scheduled.request_id]
        in_flight_drafts = previous.token_ids[previous.num_tokens - previous.num_draft_tokens:]
        drafts[scheduled.request_id] = drafts_after(proposal, in_flight_drafts, num_slots)
    return drafts
