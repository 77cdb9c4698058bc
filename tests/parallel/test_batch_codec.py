"""A scheduled batch survives the trip to the other ranks: every number the forward reads, in order."""
from __future__ import annotations

import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.parallel.batch_codec import decode_batch, encode_batch


def test_batch_round_trips_without_request_ids():
    batch = ScheduledBatch([
        ScheduledRequest("prompt", list(range(100, 140)), 0, [7, 3, 9], 0, 0),
        ScheduledRequest("verify", [5, 6, 7, 8, 9], 40, [1, 2, 4], 4, 5, previous_token_row=2, previous_num_drafts=3),
        ScheduledRequest("decode", [11], 16, [0, 8], 0, 1),
    ], previous_result=torch.tensor([[21, 0], [22, 1], [23, 3]]))
    host, feedback = encode_batch(batch)
    assert host.dtype == torch.int64 and host.dim() == 1 and feedback is batch.previous_result
    decoded = decode_batch(host, feedback)
    fields = ("token_ids", "start_position", "block_table", "num_draft_tokens", "num_logits", "previous_token_row",
              "previous_num_drafts")
    for got, sent in zip(decoded.requests, batch.requests, strict=True):
        assert [getattr(got, f) for f in fields] == [getattr(sent, f) for f in fields]
    assert decoded.previous_result is feedback


def test_batch_without_device_tokens_decodes_without_them():
    host, feedback = encode_batch(ScheduledBatch([ScheduledRequest("a", [1], 3, [0], 0, 1)]))
    assert feedback is None and decode_batch(host, None).previous_result is None
