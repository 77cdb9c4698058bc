"""The CUDA-graph step's inputs (verifier_service/engine/graph_inputs.py) against a plain reference.

The reference spells the layout out one sequence and one row at a time; the packer computes it with numpy
and step_positions expands it with tensor ops (inside the graph on CUDA). They must agree on every field for
random batches: full-width and short sequences, padding sequences, block tables of different lengths,
positions at max_model_len - 1, and starts moved by the drafts a step still in flight accepts.
"""
from __future__ import annotations

import random

import pytest
import torch

from verifier_service.engine.batch import ScheduledRequest
from verifier_service.engine.graph_inputs import GraphGeometry, pack_graph_inputs, section_sizes, step_positions


def reference_buffer(requests, bucket: int, width: int, g: GraphGeometry) -> list[int]:
    ids, starts, counts, tables, rows = [], [], [], [], []
    for i in range(bucket):
        r = requests[i] if i < len(requests) else None
        tokens, table = (r.token_ids, r.block_table) if r else ([], [])
        ids += list(tokens) + [0] * (width - len(tokens))
        starts.append(r.start_position if r else 0)
        counts.append(len(tokens))
        tables += table + [g.scratch_block] * (g.max_blocks - len(table))
        rows += [i * width + j for j in range(len(tokens))]
    return ids + starts + counts + [0] * bucket + tables + rows


def reference_positions(requests, advances, bucket: int, width: int, g: GraphGeometry):
    size, scratch = g.block_size, g.scratch_block
    positions, slots, context_lens = [], [], []
    for i in range(bucket):
        r = requests[i] if i < len(requests) else None
        start = r.start_position + advances[i] if r else 0
        count, table = (len(r.token_ids), r.block_table) if r else (0, [])
        for j in range(width):
            if j < count:
                p = start + j
                positions.append(p)
                slots.append(table[p // size] * size + p % size)
            else:
                positions.append(min(start + count - 1, g.max_position) if count else 0)
                slots.append(scratch * size + (i * width + j) % size)
        context_lens.append(start + width)
    return positions, slots, context_lens


def random_batch(rng: random.Random, n: int, width: int, g: GraphGeometry) -> tuple[list[ScheduledRequest], list[int]]:
    """Requests and the advance each takes on the device (within what its block table covers)."""
    requests, advances = [], []
    for i in range(n):
        count = rng.randint(1, width)
        advance = rng.randint(0, 3) if rng.random() < 0.5 else 0
        start = rng.randint(0, g.max_position + 1 - count - advance)
        num_blocks = -(-(start + advance + count) // g.block_size)
        table = rng.sample(range(g.scratch_block), num_blocks)
        tokens = [rng.randrange(1000) for _ in range(count)]
        requests.append(ScheduledRequest(f"r{i}", tokens, start, table, count - 1, count))
        advances.append(advance)
    return requests, advances


@pytest.mark.parametrize("seed", range(20))
def test_packed_buffer_and_its_expansion_equal_the_reference(seed):
    rng = random.Random(seed)
    block_size, max_model_len, width = rng.choice([4, 16, 256]), rng.choice([32, 64, 512]), rng.choice([1, 2, 5, 9])
    g = GraphGeometry(block_size, scratch_block=999, max_blocks=-(-(max_model_len + width) // block_size),
                      max_position=max_model_len - 1)
    bucket = rng.choice([1, 2, 8, 16, 48])
    requests, advances = random_batch(rng, rng.randint(1, bucket), width, g)
    advances += [0] * (bucket - len(requests))
    host, num_rows = pack_graph_inputs(requests, bucket, width, g, pin_memory=False)
    assert host.tolist() == reference_buffer(requests, bucket, width, g)
    assert num_rows == sum(len(r.token_ids) for r in requests)

    ids, starts, counts, _, tables, _ = host.split(section_sizes(bucket, width, g.max_blocks, num_rows))
    positions, slots, context_lens = step_positions(starts, torch.tensor(advances), counts,
                                                    tables.view(bucket, g.max_blocks), g, width)
    expected = reference_positions(requests, advances, bucket, width, g)
    assert (positions.tolist(), slots.tolist(), context_lens.tolist()) == expected
    assert context_lens.dtype == torch.int32
