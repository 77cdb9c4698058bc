"""feed_previous_tokens puts the tokens still on the device at each placeholder row: flattened batches
(eager steps) and the padded [bucket, width] rows of a CUDA-graph step, whose layout the GPU tests only
reach through whole engines."""
from __future__ import annotations

import pytest
import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.previous_tokens import feed_previous_tokens

PLACEHOLDER = 0


def batch_with_previous_tokens() -> ScheduledBatch:
    """Three requests: the first and last take a previous token (rows 2 and 0 of it), the middle one does not."""
    requests = [
        ScheduledRequest("a", [PLACEHOLDER], 7, [0], 0, 1, previous_token_row=2),
        ScheduledRequest("b", [11, 12, 13], 0, [1], 0, 1),
        ScheduledRequest("c", [PLACEHOLDER, 21], 5, [2], 1, 2, previous_token_row=0),
    ]
    return ScheduledBatch(requests, previous_tokens=torch.tensor([101, 102, 103]))


@pytest.mark.parametrize("width, rows, expected", [
    (None, [PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21], [103, 11, 12, 13, 101, 21]),  # flattened
    (3, [PLACEHOLDER, -1, -1, 11, 12, 13, PLACEHOLDER, 21, -1, -1, -1, -1],  # [bucket 4, width 3], padded
     [103, -1, -1, 11, 12, 13, 101, 21, -1, -1, -1, -1]),
])
def test_each_placeholder_takes_its_row_of_the_previous_tokens(width, rows, expected):
    ids = torch.tensor(rows)
    feed_previous_tokens(ids, batch_with_previous_tokens(), width)
    assert ids.tolist() == expected


def test_a_batch_without_previous_tokens_is_left_alone():
    batch = batch_with_previous_tokens()
    batch.previous_tokens = None
    ids = torch.tensor([PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21])
    feed_previous_tokens(ids, batch)
    assert ids.tolist() == [PLACEHOLDER, 11, 12, 13, PLACEHOLDER, 21]
