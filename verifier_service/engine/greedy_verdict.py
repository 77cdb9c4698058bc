"""Greedy verification inside a CUDA-graph step: the target's argmax judged against the drafts it was fed.

In a decode / verify step sequence i feeds its last token and then its drafts, one per row, and the model
scores every row. Under greedy decoding draft j (fed at row j + 1) is accepted when it equals the argmax of
row j, left to right until the first disagreement; the tokens emitted are the argmax of rows
0..num_accepted (the accepted drafts equal their rows' argmax, and the next argmax is the recovered or
bonus token). This is the rejection sampler's greedy rule (rejection_sampler.py) for the padded
[bucket, width] layout of a graph step, so that it runs inside the captured graph: a greedy step then
launches no sampling kernels from the host, and its result has the rejection sampler's layout.

The argmax runs in two stages (row_argmax): compiled as one reduction, a row of a 151,936-word vocabulary was one
program's serial loop, 63-79 us of a batch-1 decode step on an H100 (docs/BENCHMARKS_ARCHIVE.md, round 13).
"""
from __future__ import annotations

import torch


def greedy_verdict(
    logits: torch.Tensor,  # [bucket * width, vocab]: every row of the step
    ids: torch.Tensor,  # [bucket, width] int64: the tokens fed (last sampled token, then drafts)
    counts: torch.Tensor,  # [bucket] int64: real rows per sequence (1 + its drafts; 0 for padding)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [bucket, width + 1]: emitted tokens then num_accepted, as PendingVerification holds them;
    continuation [bucket, 2]: the last token emitted and num_accepted)."""
    bucket, width = ids.shape
    target = row_argmax(logits).view(bucket, width)  # [bucket, width]
    columns = torch.arange(1, width, device=ids.device)
    agrees = (ids[:, 1:] == target[:, :-1]) & (columns < counts.unsqueeze(1))  # [bucket, width - 1]
    num_accepted = agrees.long().cumprod(dim=1).sum(dim=1, keepdim=True)  # [bucket, 1]
    rows = torch.cat([target, num_accepted], dim=1)
    continuation = torch.cat([target.gather(1, num_accepted), num_accepted], dim=1)
    return rows, continuation


def decode_verdict(
    logits: torch.Tensor,  # [bucket, vocab]: one row per sequence, no drafts
    ids: torch.Tensor,  # [bucket, 1]
    counts: torch.Tensor,  # [bucket]
) -> tuple[torch.Tensor, torch.Tensor]:
    """greedy_verdict of a plain decode step (width 1: nothing to judge): each row's argmax, 0 drafts accepted.

    A function of its own, so that CUDA graphs compile it apart from greedy_verdict (docs/BENCHMARKS_ARCHIVE.md, round
    12): compiled as greedy_verdict, with dynamic shapes, the 256-row decode steps of a server that also captured
    verify widths spent 0.35 ms in the verdict's kernel against 0.045 ms where only width 1 was captured (H100)."""
    target = row_argmax(logits).unsqueeze(1)  # [bucket, 1]
    rows = torch.cat([target, torch.zeros_like(target)], dim=1)  # width 1: the continuation has the same layout
    return rows, rows


CHUNKS = 128  # programs per row in the first stage (fewer where the vocabulary is not a multiple)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] -> logits.argmax(dim=-1) [rows], the same index on ties (the first maximum) and NaN.

    First each of up to CHUNKS slices of a row finds its maximum and the first index holding it, then the row takes
    the first slice holding the largest of those: many programs per row instead of one."""
    rows, vocab = logits.shape
    chunks = CHUNKS
    while vocab % chunks:
        chunks //= 2
    width = vocab // chunks
    best, where = logits.view(rows, chunks, width).max(dim=-1)  # [rows, chunks]: a view of a row slice too
    chunk = best.argmax(dim=-1, keepdim=True)  # [rows, 1]
    return (chunk * width + where.gather(1, chunk)).squeeze(1)
