"""The CUDA-graph step's host buffer (verifier_service/engine/graph_inputs.py) against a plain reference.

The reference spells the layout out one sequence and one row at a time; the packer computes it with
numpy. They must agree on every field for random batches: full-width and short sequences, padding
sequences, block tables of different lengths, positions at max_model_len - 1.
"""
from __future__ import annotations

import random

import pytest

from verifier_service.engine.batch import ScheduledRequest
from verifier_service.engine.graph_inputs import GraphGeometry, pack_graph_inputs


def reference(requests, bucket: int, width: int, g: GraphGeometry) -> list[int]:
    size, scratch = g.block_size, g.scratch_block
    ids, positions, slots, context_lens, tables, rows = [], [], [], [], [], []
    for i in range(bucket):
        if i < len(requests):
            r = requests[i]
            start, tokens, table = r.start_position, r.token_ids, r.block_table
        else:  # a padding sequence
            start, tokens, table = 0, [], []
        for j in range(width):
            if j < len(tokens):
                p = start + j
                ids.append(tokens[j])
                positions.append(p)
                slots.append(table[p // size] * size + p % size)
                rows.append(i * width + j)
            else:
                ids.append(0)
                positions.append(min(start + len(tokens) - 1, g.max_position) if tokens else 0)
                slots.append(scratch * size + (i * width + j) % size)
        context_lens.append(start + width)
        tables += table + [scratch] * (g.max_blocks - len(table))
    return ids + positions + slots + context_lens + tables + rows


def random_batch(rng: random.Random, n: int, width: int, g: GraphGeometry) -> list[ScheduledRequest]:
    requests = []
    for i in range(n):
        count = rng.randint(1, width)
        start = rng.randint(0, g.max_position + 1 - count)
        num_blocks = -(-(start + count) // g.block_size)
        table = rng.sample(range(g.scratch_block), num_blocks)
        tokens = [rng.randrange(1000) for _ in range(count)]
        requests.append(ScheduledRequest(f"r{i}", tokens, start, table, count - 1, count))
    return requests


@pytest.mark.parametrize("seed", range(20))
def test_packed_buffer_equals_the_reference(seed):
    rng = random.Random(seed)
    block_size, max_model_len, width = rng.choice([4, 16, 256]), rng.choice([32, 64, 512]), rng.choice([1, 2, 5, 9])
    g = GraphGeometry(block_size, scratch_block=999, max_blocks=-(-(max_model_len + width) // block_size),
                      max_position=max_model_len - 1)
    bucket = rng.choice([1, 2, 8, 16, 48])
    requests = random_batch(rng, rng.randint(1, bucket), width, g)
    host, num_rows = pack_graph_inputs(requests, bucket, width, g, pin_memory=False)
    expected = reference(requests, bucket, width, g)
    assert host.tolist() == expected
    assert num_rows == sum(len(r.token_ids) for r in requests)
