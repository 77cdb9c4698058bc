"""The host side of a CUDA-graph step: every input of a [bucket, width] decode / verify step in one buffer.

Layout, int64: [ids | positions | slots | context_lens | block tables | logit rows], sized by
`section_sizes` (which the graph runner splits the copied buffer with). Sequence i owns rows
[i * width, (i + 1) * width); see cuda_graphs.py for why padding rows and padding sequences are safe:
- a sequence with count < width tokens: padding rows get id 0, the position of its last token and a
  slot in the scratch block, (i * width + j) % block_size;
- sequences i >= len(requests) (the bucket's padding) are all padding: position 0, scratch slots,
  a table of scratch blocks and context length `width`;
- context_lens[i] = start + width (padding rows included: bottom-right causal alignment);
- logit rows: i * width + j for the real rows only.

Only the per-sequence gather (token ids, start, block table) is a Python loop; positions, slots and
rows are computed with numpy for the whole batch. At batch 256 this is the largest host cost of a
decode step that the GPU waits for (it runs between one step's sync and the next step's launch).
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
    """Lengths of the buffer's sections: ids, positions, slots, context_lens, block tables, logit rows."""
    num_inputs = bucket * width
    return [num_inputs, num_inputs, num_inputs, bucket, bucket * max_blocks, num_rows]


def pack_graph_inputs(requests: Sequence[ScheduledRequest], bucket: int, width: int,
                      geometry: GraphGeometry, pin_memory: bool) -> tuple[torch.Tensor, int]:
    """(the int64 host buffer of the module docstring, number of logit rows)."""
    size, scratch, max_blocks = geometry.block_size, geometry.scratch_block, geometry.max_blocks
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
    start = np.array(starts + [0] * padding, dtype=np.int64)[:, None]  # [bucket, 1]
    count = np.array(counts + [0] * padding, dtype=np.int64)[:, None]
    table = np.array(tables + [scratch] * (padding * max_blocks), dtype=np.int64).reshape(bucket, max_blocks)
    columns = np.arange(width, dtype=np.int64)
    real = columns < count  # [bucket, width]
    position = start + columns
    block = np.take_along_axis(table, np.minimum(position // size, max_blocks - 1), axis=1)
    scratch_slot = scratch * size + (np.arange(bucket, dtype=np.int64)[:, None] * width + columns) % size
    rows = np.flatnonzero(real)
    sizes = section_sizes(bucket, width, max_blocks, rows.size)
    host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pin_memory)
    out = host.numpy()
    ends = np.cumsum(sizes[:-1]).tolist()
    out[:len(ids)] = ids
    out[len(ids):ends[0]] = 0
    out[ends[0]:ends[1]] = np.where(real, position, np.clip(start + count - 1, 0, geometry.max_position)).ravel()
    out[ends[1]:ends[2]] = np.where(real, block * size + position % size, scratch_slot).ravel()
    out[ends[2]:ends[3]] = start[:, 0] + width
    out[ends[3]:ends[4]] = table.ravel()
    out[ends[4]:] = rows
    return host, int(rows.size)
