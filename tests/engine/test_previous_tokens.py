"""Continuing from a step still in flight (previous_tokens.py): its last tokens go to each placeholder row of
flattened batches (eager steps) and of the padded [bucket, width] rows of a CUDA-graph step, its accepted
counts to the graph's advances, and an eager step whose starts depend on them gets the real ones: on the device
(advance_on_device) exactly as the host builds them from the step's result (support/resolved_steps.py)."""
from __future__ import annotations

import pytest
import torch

from support.resolved_steps import resolve_on_host
from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.previous_tokens import advance_on_device, feed_previous_tokens, may_advance

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


def flattened(batch: ScheduledBatch, block_size: int) -> tuple[AttentionMetadata, torch.Tensor]:
    """The attention metadata and positions of batch as ModelRunner.execute flattens it (CPU)."""
    positions = [p for r in batch.requests for p in range(r.start_position, r.context_len)]
    slots = [r.block_table[p // block_size] * block_size + p % block_size
             for r in batch.requests for p in range(r.start_position, r.context_len)]
    metadata = AttentionMetadata.build([r.num_tokens for r in batch.requests], [r.context_len for r in batch.requests],
                                       [r.block_table for r in batch.requests], slots, block_size, "cpu")
    return metadata, torch.tensor(positions)


def test_an_eager_step_advanced_on_the_device_equals_the_step_resolved_on_the_host():
    batch = continuing_batch(num_drafts=4)  # "c" continues from a row that accepted 3 of its 4 drafts
    ids = torch.tensor([PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21])
    advances = torch.zeros(3, dtype=torch.int64)
    feed_previous_tokens(ids, batch, advances=advances)
    metadata, positions = advance_on_device(batch, *flattened(batch, block_size=8), advances)

    expected, expected_positions = flattened(resolve_on_host(batch), block_size=8)
    assert positions.tolist() == expected_positions.tolist() == [7, 0, 1, 2, 8, 9]
    assert metadata.slot_mapping.tolist() == expected.slot_mapping.tolist() == [7, 8, 9, 10, 24, 25]
    assert metadata.context_lens.tolist() == expected.context_lens.tolist() == [8, 3, 10]
    assert metadata.cu_seqlens_k.tolist() == expected.cu_seqlens_k.tolist()
    assert metadata.cu_seqlens_q.tolist() == expected.cu_seqlens_q.tolist()
    assert metadata.max_seqlen_k == 11 >= expected.max_seqlen_k  # an upper bound: all 4 drafts accepted
    assert ids.tolist() == [103, 11, 12, 13, 101, 21]
