"""The key each logits row samples with: (its request's seed, the output position of the token it picks).

Row j of a request that scores d drafts picks the request's output token number base + j, where base counts
the outputs before this step: base = (tokens up to the step's last real token) - prompt length + the
request's output_position_offset (outputs a resumed stream carries in its prompt). After a preemption the
request recomputes prompt + output, and after a prefix-cache hit it feeds less of its prompt, but base comes
out the same: the key depends on the position only, never on the step, the batch or the drafts before it.

With async scheduling a step is launched before the previous one's accepted-draft count reaches the host:
the entry's start_position assumes none was accepted, and the real count, still on the device in
batch.previous_result (previous_tokens.py), is added here on the device - as the model's token positions
are - so the step launched ahead keys its rows exactly as a synchronous step would.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from verifier_service.engine import keyed_noise
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.request import Request
from verifier_service.host_copy import to_device


def first_output_position(scheduled: ScheduledRequest, request: Request) -> int:
    """The output position of the token the entry's first logits row picks (before any device advance)."""
    last_real = scheduled.start_position + scheduled.num_tokens - scheduled.num_draft_tokens
    return last_real - len(request.prompt_token_ids) + request.params.output_position_offset


def row_sampling_keys(batch: ScheduledBatch, requests: Sequence[Request],
                      device: torch.device) -> torch.Tensor:  # [num_rows] int64, keyed_noise.row_keys
    """The key of every logits row of batch (requests: the engine's Request of each entry, in batch order).

    Rows of greedy requests (no seed) get seed 0: a key like any other, which the sampler does not use.
    One host-to-device copy (non-blocking on CUDA) and no host sync.
    """
    seeds, positions, previous_rows = [], [], []
    for scheduled, request in zip(batch.requests, requests):
        if not scheduled.num_logits:
            continue
        seed, first = keyed_noise.as_int64(request.seed or 0), first_output_position(scheduled, request)
        previous_row = scheduled.previous_token_row if scheduled.previous_num_drafts > 0 else -1
        seeds += [seed] * scheduled.num_logits
        positions += range(first, first + scheduled.num_logits)
        previous_rows += [previous_row] * scheduled.num_logits
    advancing = batch.previous_result is not None and any(row >= 0 for row in previous_rows)
    values = to_device(seeds + positions + (previous_rows if advancing else []), torch.int64, device)
    seeds_t, positions_t = values[:len(seeds)], values[len(seeds):2 * len(seeds)]
    if advancing:  # the drafts the step in flight accepts shift these rows' positions
        previous_t = values[2 * len(seeds):]
        accepted = batch.previous_result[previous_t.clamp(min=0), 1]
        positions_t = positions_t + torch.where(previous_t >= 0, accepted, 0)
    return keyed_noise.row_keys(seeds_t, positions_t)
