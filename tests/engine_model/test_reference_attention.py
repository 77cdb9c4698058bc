"""The reference paged attention equals dense causal attention, whatever the block layout."""
from __future__ import annotations

import math

import pytest
import torch

from engine_model.checkpoints import random_block_tables
from verifier_service.attention.metadata import AttentionMetadata, attention_context, current_attention_metadata
from verifier_service.attention.reference import ReferenceAttentionBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 8


def dense_causal_attention(query, keys, values, context_len):
    """query [q, heads, dim] at the last q positions of keys/values [context_len, kv_heads, dim]."""
    group = NUM_HEADS // NUM_KV_HEADS
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) / math.sqrt(HEAD_DIM)
    query_pos = torch.arange(context_len - query.shape[0], context_len)[:, None]
    scores = scores.masked_fill(torch.arange(context_len)[None, :] > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


def run_step(cached_lens, query_lens, block_size, seed):
    """Caches `cached_lens` tokens per sequence, then attends `query_lens` new ones; returns (paged, dense)."""
    generator = torch.Generator().manual_seed(seed)
    context_lens = [c + q for c, q in zip(cached_lens, query_lens)]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 3
    tables = random_block_tables(num_blocks, context_lens, block_size, seed)
    k_cache = torch.randn(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, generator=generator)  # garbage elsewhere
    v_cache = torch.randn(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    keys = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=generator) for n in context_lens]
    values = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=generator) for n in context_lens]
    queries = [torch.randn(q, NUM_HEADS, HEAD_DIM, generator=generator) for q in query_lens]
    backend = ReferenceAttentionBackend()

    def slots(table, positions):
        return [table[p // block_size] * block_size + p % block_size for p in positions]

    history = AttentionMetadata.build(  # only its slot_mapping is used, to store the cached prefix
        [1], [1], [[0]], [s for t, c in zip(tables, cached_lens) for s in slots(t, range(c))], block_size, "cpu")
    backend.write_kv(torch.cat([k[:c] for k, c in zip(keys, cached_lens)]),
                     torch.cat([v[:c] for v, c in zip(values, cached_lens)]), k_cache, v_cache, history)
    step_slots = [s for t, c, n in zip(tables, cached_lens, context_lens) for s in slots(t, range(c, n))]
    metadata = AttentionMetadata.build(query_lens, context_lens, tables, step_slots, block_size, torch.device("cpu"))
    backend.write_kv(torch.cat([k[c:] for k, c in zip(keys, cached_lens)]),
                     torch.cat([v[c:] for v, c in zip(values, cached_lens)]), k_cache, v_cache, metadata)
    paged = backend.attend(torch.cat(queries), k_cache, v_cache, metadata, scale=HEAD_DIM ** -0.5)
    dense = torch.cat([dense_causal_attention(q, k, v, n) for q, k, v, n in zip(queries, keys, values, context_lens)])
    return paged, dense


@pytest.mark.parametrize("cached_lens, query_lens, block_size", [
    ([0], [13], 4),  # one fresh prompt
    ([37], [1], 16),  # batch-1 decode
    ([20], [5], 8),  # batch-1 verify: last token + 4 drafts
    ([0, 9, 30, 17, 5], [11, 1, 4, 6, 3], 4),  # first chunk, decode, verify, later chunk, verify
    ([3, 3, 3], [4, 4, 4], 2),  # uniform query lengths (every sequence verifying 3 drafts)
    ([63, 0], [2, 64], 16),  # block boundaries exactly filled
])
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_attention_equals_dense_causal_attention(cached_lens, query_lens, block_size, seed):
    paged, dense = run_step(cached_lens, query_lens, block_size, seed)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)


def test_write_kv_stores_each_token_at_its_slot():
    backend = ReferenceAttentionBackend()
    k_cache, v_cache = torch.zeros(4, 2, 1, 3), torch.zeros(4, 2, 1, 3)
    key, value = torch.randn(3, 1, 3), torch.randn(3, 1, 3)
    metadata = AttentionMetadata.build([3], [3], [[3, 1]], [6, 7, 2], 2, torch.device("cpu"))
    backend.write_kv(key, value, k_cache, v_cache, metadata)
    assert torch.equal(k_cache[3, 0], key[0]) and torch.equal(k_cache[3, 1], key[1])
    assert torch.equal(v_cache[1, 0], value[2]) and k_cache[0].abs().sum() == 0


def test_attention_context_refuses_to_nest():
    metadata = AttentionMetadata.build([1], [1], [[0]], [0], 16, torch.device("cpu"))
    with attention_context(metadata):
        assert current_attention_metadata() is metadata
        with pytest.raises(RuntimeError, match="nest"):
            with attention_context(metadata):
                pass
    with pytest.raises(RuntimeError, match="attention_context"):
        current_attention_metadata()
