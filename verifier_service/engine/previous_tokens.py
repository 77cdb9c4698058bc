"""Feeding a step what only the device knows yet (async scheduling, see engine.py).

When step N + 1 is scheduled while step N still runs, a request that step N emits tokens for continues
from N's result, which the host has not seen: the scheduler puts a placeholder in token_ids[0] and a start
position that assumes N accepts none of the request's drafts, and the engine points `previous_token_row`
at the request's row of N's result, `previous_result` [n, 2] = (last token emitted, drafts accepted), still
on the device. Two ways to use it, neither waiting for step N:
- `feed_previous_tokens`: overwrite the placeholders of the device input ids (a gather and a scatter, no
  host sync); enough where no entry can advance (N scored no drafts for it); with `advances`, also the accepted
  counts per entry, which a CUDA-graph step adds to its positions inside the graph (cuda_graphs.py computes
  positions, slots and context lengths from them there);
- `advance_on_device`: the same for an eager or piecewise step (a prompt mixed with drafting sequences, a batch
  beyond the captured ones): its positions, slots and attention metadata moved on by the accepted counts.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.host_copy import to_device

if TYPE_CHECKING:
    from verifier_service.engine.rejection_sampler import PendingVerification


def continue_from(batch: ScheduledBatch, in_flight: ScheduledBatch, verification: PendingVerification) -> None:
    """Points every entry of batch whose request emits tokens in in_flight at its row of in_flight's result
    (still on the device), with the drafts in_flight scored for it (its start may move by up to that many)."""
    rows = {in_flight.requests[index].request_id: row for row, index in enumerate(verification.batch_indices)}
    drafts = {scheduled.request_id: scheduled.num_draft_tokens for scheduled in in_flight.requests}
    for scheduled in batch.requests:
        scheduled.previous_token_row = rows.get(scheduled.request_id, -1)
        if scheduled.previous_token_row >= 0:
            scheduled.previous_num_drafts = drafts[scheduled.request_id]
    batch.previous_result = verification.previous_result


def continuation_pairs(batch: ScheduledBatch, width: int | None = None) -> tuple[list[int], list[int]]:
    """For every entry that continues from the previous step's result: its batch position, its row of the
    result, and its first input row (i * width in a padded CUDA-graph step, else the tokens before it)."""
    positions, rows, first_rows, row = [], [], [], 0
    for index, request in enumerate(batch.requests):
        if request.previous_token_row >= 0:
            positions.append(index)
            rows.append(request.previous_token_row)
            first_rows.append(index * width if width is not None else row)
        row += request.num_tokens
    return positions, rows, first_rows


def may_advance(batch: ScheduledBatch) -> bool:
    """Whether some entry's start depends on how many drafts the previous step accepts."""
    return batch.previous_result is not None and any(
        r.previous_token_row >= 0 and r.previous_num_drafts > 0 for r in batch.requests)


def feed_previous_tokens(ids: torch.Tensor, batch: ScheduledBatch, width: int | None = None,
                         advances: torch.Tensor | None = None) -> None:
    """Writes the previous step's last tokens into the device input ids at the placeholder rows, and with
    `advances` ([batch size] int64 on the device, zeros elsewhere) its accepted counts at those entries.

    ids: [num_input_rows] int64 on the device. width: rows per sequence in a padded CUDA-graph step (sequence
    i starts at row i * width); None for a flattened batch. One small host-to-device copy, no host sync.
    """
    if batch.previous_result is None:
        return
    positions, rows, first_rows = continuation_pairs(batch, width)
    if not rows:
        return
    pairs = to_device(first_rows + rows + positions, torch.int64, ids.device).view(3, -1)
    taken = batch.previous_result[pairs[1]]  # [n, 2]
    ids.index_copy_(0, pairs[0], taken[:, 0])
    if advances is not None:
        advances.index_copy_(0, pairs[2], taken[:, 1])


def advance_on_device(batch: ScheduledBatch, metadata: AttentionMetadata, positions: torch.Tensor,
                      advances: torch.Tensor) -> tuple[AttentionMetadata, torch.Tensor]:
    """The metadata and positions [num_tokens] of a flattened step, built as scheduled (no draft of the step in
    flight accepted), moved on by `advances` ([batch size] int64 on the device: feed_previous_tokens's accepted
    counts). Positions, slots, context lengths and their running sum move on the device; max_seqlen_k becomes an
    upper bound (every draft accepted: each request's block table covers that case), which the kernels take as
    such. No host sync."""
    query_lens = (metadata.cu_seqlens_q[1:] - metadata.cu_seqlens_q[:-1]).long()
    rows_batch = torch.repeat_interleave(torch.arange(len(batch.requests), device=positions.device), query_lens,
                                         output_size=positions.shape[0])  # each token's sequence
    positions = positions + advances[rows_batch]
    block_size = metadata.block_size
    slots = metadata.block_tables[rows_batch, positions // block_size].long() * block_size + positions % block_size
    context_lens = metadata.context_lens + advances.to(torch.int32)
    cu_seqlens_k = torch.zeros_like(metadata.cu_seqlens_k)
    torch.cumsum(context_lens, 0, dtype=torch.int32, out=cu_seqlens_k[1:])
    longest = max(r.context_len + (r.previous_num_drafts if r.previous_token_row >= 0 else 0) for r in batch.requests)
    return dataclasses.replace(metadata, slot_mapping=slots, context_lens=context_lens, cu_seqlens_k=cu_seqlens_k,
                               max_seqlen_k=longest), positions
