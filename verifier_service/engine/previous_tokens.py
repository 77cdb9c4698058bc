"""Feeding a step tokens that only the device knows yet (async scheduling, see engine.py).

When step N + 1 is scheduled while step N still runs, a request that step N samples a token for feeds
that token next, but the host has not seen it: the scheduler puts a placeholder in token_ids[0] and the
engine points `previous_token_row` at the token's row of step N's result (still on the device). The
runner builds its input ids as usual and then overwrites the placeholders on the device with this.
"""
from __future__ import annotations

import torch

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.host_copy import to_device


def feed_previous_tokens(ids: torch.Tensor, batch: ScheduledBatch, width: int | None = None) -> None:
    """Writes batch.previous_tokens into the device input ids where the batch has placeholders.

    ids: [num_input_rows] int64 on the device. width: rows per sequence in a padded CUDA-graph step
    (sequence i starts at row i * width); None for a flattened batch (each starts after the one before).
    One small host-to-device copy of the row pairs, then a gather and a scatter: no host sync.
    """
    if batch.previous_tokens is None:
        return
    destinations, sources, row = [], [], 0
    for index, request in enumerate(batch.requests):
        if request.previous_token_row >= 0:
            destinations.append(index * width if width is not None else row)
            sources.append(request.previous_token_row)
        row += request.num_tokens
    if not destinations:
        return
    pairs = to_device(destinations + sources, torch.int64, ids.device).view(2, -1)
    ids.index_copy_(0, pairs[0], batch.previous_tokens[pairs[1]])
