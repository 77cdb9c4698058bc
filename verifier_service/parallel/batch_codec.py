"""A ScheduledBatch as one int64 host buffer and back: what rank 0 sends the other ranks each step.

Layout: [num_requests] + per request its seven numbers (num_tokens, start_position, len(block_table),
num_draft_tokens, num_logits, previous_token_row, previous_num_drafts) + every request's token ids + every
request's block table, in batch order. Request ids stay on rank 0 (the forward never reads them).
The batch's device tensor (`previous_result`: what the step in flight emits, which only the device knows
yet under async scheduling) travels beside the buffer as the step's feedback (step_channel.py).
"""
from __future__ import annotations

from itertools import chain

import numpy as np
import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest

_FIELDS = 7  # numbers per request


def encode_batch(batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the int64 host buffer of the module docstring, batch.previous_result)."""
    requests = batch.requests
    numbers = [(r.num_tokens, r.start_position, len(r.block_table), r.num_draft_tokens, r.num_logits,
                r.previous_token_row, r.previous_num_drafts) for r in requests]
    ids = list(chain.from_iterable(r.token_ids for r in requests))
    tables = list(chain.from_iterable(r.block_table for r in requests))
    buffer = np.empty(1 + _FIELDS * len(requests) + len(ids) + len(tables), dtype=np.int64)
    ends = np.cumsum([1, _FIELDS * len(requests), len(ids)])
    buffer[0] = len(requests)
    buffer[ends[0]:ends[1]] = np.asarray(numbers, dtype=np.int64).ravel()
    buffer[ends[1]:ends[2]] = ids
    buffer[ends[2]:] = tables
    return torch.from_numpy(buffer), batch.previous_result


def decode_batch(host: torch.Tensor, feedback: torch.Tensor | None) -> ScheduledBatch:
    """The ScheduledBatch encode_batch was given (request ids are the request's index in the batch)."""
    values = host.numpy()
    num_requests = int(values[0])
    numbers = values[1:1 + _FIELDS * num_requests].reshape(num_requests, _FIELDS).tolist()
    cursor = 1 + _FIELDS * num_requests
    ids = values[cursor:cursor + sum(n[0] for n in numbers)].tolist()
    tables = values[cursor + len(ids):].tolist()
    requests, id_at, table_at = [], 0, 0
    for index, (num_tokens, start, num_blocks, num_drafts, num_logits, previous_row, previous_drafts) in \
            enumerate(numbers):
        requests.append(ScheduledRequest(str(index), ids[id_at:id_at + num_tokens], start,
                                         tables[table_at:table_at + num_blocks], num_drafts, num_logits,
                                         previous_row, previous_drafts))
        id_at += num_tokens
        table_at += num_blocks
    return ScheduledBatch(requests, feedback)
