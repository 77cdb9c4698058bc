"""Continuing from a step still in flight (previous_tokens.py): its last tokens go to each placeholder row of
flattened batches (eager steps) and of the padded [bucket, width] rows of a CUDA-graph step, its accepted
counts to the graph's advances, and an eager step whose starts depend on them gets the real ones."""
from __future__ import annotations

import pytest
import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.previous_tokens import feed_previous_tokens, may_advance, resolve_on_host

PLACEHOLDER = 0


def continuing_batch(num_drafts: int = 0) -> ScheduledBatch:
    """Three requests: the first and last continue from rows 2 and 0 of the previous result, the middle one
    does not; the previous step scored num_drafts drafts for the last one."""
    requests = [
        ScheduledRequest("a", [PLACEHOLDER], 7, [0], 0, 1, previous_token_row=2),
        ScheduledRequest("b", [11, 12, 13], 0, [1], 0, 1),
        ScheduledRequest("c", [PLACEHOLDER, 21], 5, [2, 3], 1, 2, previous_token_row=0,
                         previous_num_drafts=num_drafts),
    ]
    result = torch.tensor([[101, 3], [102, 0], [103, 0]])  # (last token, drafts accepted) per previous row
    return ScheduledBatch(requests, previous_result=result)


@pytest.mark.parametrize("width, rows, expected", [
    (None, [PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21], [103, 11, 12, 13, 101, 21]),  # flattened
    (3, [PLACEHOLDER, -1, -1, 11, 12, 13, PLACEHOLDER, 21, -1, -1, -1, -1],  # [bucket 4, width 3], padded
     [103, -1, -1, 11, 12, 13, 101, 21, -1, -1, -1, -1]),
])
def test_each_placeholder_takes_its_row_of_the_previous_result(width, rows, expected):
    ids = torch.tensor(rows)
    feed_previous_tokens(ids, continuing_batch(), width)
    assert ids.tolist() == expected


def test_the_accepted_counts_go_to_the_continuing_entries_advances():
    ids, advances = torch.zeros(12, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    feed_previous_tokens(ids, continuing_batch(num_drafts=4), 3, advances)
    assert advances.tolist() == [0, 0, 3, 0]


def test_a_batch_without_a_previous_result_is_left_alone():
    batch = continuing_batch()
    batch.previous_result = None
    ids = torch.tensor([PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21])
    feed_previous_tokens(ids, batch)
    assert ids.tolist() == [PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21]
    assert not may_advance(batch) and resolve_on_host(batch) is batch


def test_an_eager_step_gets_real_tokens_and_starts_and_the_batch_is_left_as_it_was():
    batch = continuing_batch(num_drafts=4)
    assert may_advance(batch) and not may_advance(continuing_batch(num_drafts=0))
    resolved = resolve_on_host(batch)
    assert [(r.token_ids, r.start_position, r.previous_token_row) for r in resolved.requests] == [
        ([103], 7, -1), ([11, 12, 13], 0, -1), ([101, 21], 8, -1)]
    assert resolved.previous_result is None
    assert [(r.token_ids, r.start_position) for r in batch.requests] == [
        ([PLACEHOLDER], 7), ([11, 12, 13], 0), ([PLACEHOLDER, 21], 5)]
