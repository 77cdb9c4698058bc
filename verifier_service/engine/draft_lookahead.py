"""Drafts for a step launched before the previous step's tokens reach the host (async scheduling with drafts).

When step N + 1 is launched while step N still runs, the host does not know what N emits for a request:
its first a drafts (those that agree with the target) and then one token of the target's own, 1 to d + 1
tokens for d drafts. The proposer is asked, on the context known so far (through step N - 1), for d + 1 + k
tokens (Scheduler.lookahead_requests): its proposal P is its guess of how the target continues. The guess of
N's outcome follows from it: N accepts the drafts that agree with P (a = the common prefix of P and N's
drafts D) and then emits P[a]; N + 1's drafts are what P says comes after that, P[a + 1 : a + 1 + k].

For an n-gram proposer that follows a long match this is exactly the draft it would make once N's tokens
were known, and the drafter's round trip overlaps the device's step N instead of delaying step N + 1. When
N goes otherwise than guessed, N + 1's drafts are mostly rejected (N + 1 still emits the target's next
token) and the step after it guesses from N's real tokens. Drafts are only ever guesses: a wrong guess costs
acceptance, never correctness, since every draft is verified against the target.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from verifier_service.engine.batch import ScheduledBatch


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
