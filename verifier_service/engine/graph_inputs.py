"""The inputs of a CUDA-graph step: packed on the host in one buffer, expanded on the device inside the graph.

Host buffer, int64: [ids | starts | counts | advances | block tables | logit rows], sized by `section_sizes`
(the graph runner copies it into its static input buffer with one host-to-device copy and splits it).
Sequence i of a [bucket, width] step owns rows [i * width, (i + 1) * width):
- ids: its tokens (the last sampled one, then its drafts), then id 0 in its padding rows;
- starts[i]: the position of its first token, assuming the previous step accepted none of its drafts;
  advances[i]: the drafts that step did accept (0 here; the device writes the real count into the static
  buffer for entries that continue from a step still in flight, previous_tokens.py);
- counts[i]: its real rows (0 for the bucket's padding sequences);
- block tables: its table, padded with the scratch block (no request owns it);
- logit rows: i * width + j for the real rows only (used to gather logits outside the graph).

`step_positions` turns starts, advances and counts into positions, cache slots and context lengths on the
device, inside the captured graph, so an entry's real start may be known only to the device. See
cuda_graphs.py for why padding rows and padding sequences are safe: a padding row has the position of its
sequence's last real token and writes its K/V into the scratch block; context lengths count the padding
rows (bottom-right causal alignment), so the real rows see exactly their own keys.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verifier_service.engine.batch import ScheduledRequest


@dataclass(frozen=True)
class GraphGeometry:
    """What the packing needs to know about the captured graphs and the KV cache."""

    block_size: int
    scratch_block: int  # the KV block no request owns: padding rows write here
    max_blocks: int  # block-table columns of a captured graph
    max_position: int  # max_model_len - 1


def section_sizes(bucket: int, width: int, max_blocks: int, num_rows: int) -> list[int]:
    """Lengths of the buffer's sections: ids, starts, counts, advances, block tables, logit rows."""
    return [bucket * width, bucket, bucket, bucket, bucket * max_blocks, num_rows]


def pack_graph_inputs(requests: Sequence[ScheduledRequest], bucket: int, width: int,
                      geometry: GraphGeometry, pin_memory: bool) -> tuple[torch.Tensor, int]:
    """(the int64 host buffer of the module docstring, number of logit rows)."""
    scratch, max_blocks = geometry.scratch_block, geometry.max_blocks
    table_padding = [scratch] * max_blocks
    ids: list[int] = []
    starts: list[int] = []
    counts: list[int] = []
    tables: list[int] = []
    for request in requests:
        token_ids, table = request.token_ids, request.block_table
        ids += token_ids
        if len(token_ids) < width:
            ids += [0] * (width - len(token_ids))
        starts.append(request.start_position)
        counts.append(len(token_ids))
        tables += table
        tables += table_padding[:max_blocks - len(table)]
    padding = bucket - len(requests)
    rows = np.flatnonzero(np.arange(width) < np.array(counts + [0] * padding)[:, None])
    sizes = section_sizes(bucket, width, max_blocks, rows.size)
    host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pin_memory)
    out = host.numpy()
    ends = np.cumsum(sizes).tolist()
    out[:len(ids)] = ids
    out[len(ids):ends[0]] = 0
    out[ends[0]:ends[1]] = starts + [0] * padding
    out[ends[1]:ends[2]] = counts + [0] * padding
    out[ends[2]:ends[3]] = 0
    out[ends[3]:ends[3] + len(tables)] = tables
    out[ends[3] + len(tables):ends[4]] = scratch
    out[ends[4]:] = rows
    return host, int(rows.size)


def step_positions(
    starts: torch.Tensor,  # [bucket] int64: first position, before the device's advance
    advances: torch.Tensor,  # [bucket] int64: drafts the previous step accepted (0 if it is not in flight)
    counts: torch.Tensor,  # [bucket] int64: real rows per sequence
    tables: torch.Tensor,  # [bucket, max_blocks] int64
    geometry: GraphGeometry,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """positions [bucket * width] int64, slots [bucket * width] int64, context lengths [bucket] int32."""
    bucket, size = starts.shape[0], geometry.block_size
    first = (starts + advances).unsqueeze(1)  # [bucket, 1]
    columns = torch.arange(width, device=starts.device)
    real = columns < counts.unsqueeze(1)  # [bucket, width]
    position = first + columns
    last = (first + counts.unsqueeze(1) - 1).clamp(0, geometry.max_position)
    block = tables.gather(1, (position // size).clamp(max=geometry.max_blocks - 1))
    rows = torch.arange(bucket * width, device=starts.device).view(bucket, width)
    scratch_slot = geometry.scratch_block * size + rows % size
    slots = torch.where(real, block * size + position % size, scratch_slot)
    context_lens = (first.squeeze(1) + width).to(torch.int32)
    return torch.where(real, position, last).view(-1), slots.view(-1), context_lens
