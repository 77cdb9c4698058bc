"""One attention step on a random paged layout, with its dense causal-attention answer, for backend tests."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine_model.checkpoints import random_block_tables
from verifier_service.attention.metadata import AttentionMetadata

NUM_HEADS, NUM_KV_HEADS = 6, 2


@dataclass
class PagedStep:
    query: torch.Tensor  # [num_tokens, heads, head_dim]
    new_keys: torch.Tensor  # [num_tokens, kv_heads, head_dim]: this step's keys, still to be written
    new_values: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim], holding the cached prefixes
    v_cache: torch.Tensor
    metadata: AttentionMetadata
    dense: torch.Tensor  # [num_tokens, heads, head_dim]: the answer, by dense causal attention in float32


def dense_causal_attention(query, keys, values):
    """query [q, heads, dim] at the last q positions of keys/values [context_len, kv_heads, dim]."""
    context_len, group = keys.shape[0], query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) / math.sqrt(query.shape[-1])
    query_pos = torch.arange(context_len - query.shape[0], context_len)[:, None]
    scores = scores.masked_fill(torch.arange(context_len)[None, :] > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


def _slots(table, positions, block_size):
    return [table[p // block_size] * block_size + p % block_size for p in positions]


def paged_step(cached_lens, query_lens, block_size, seed, head_dim=8, device="cpu", dtype=torch.float32):
    """Sequences with `cached_lens` tokens already cached feed `query_lens` new tokens (shuffled blocks)."""
    generator = torch.Generator().manual_seed(seed)
    context_lens = [c + q for c, q in zip(cached_lens, query_lens)]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 3
    tables = random_block_tables(num_blocks, context_lens, block_size, seed)
    shape = (num_blocks, block_size, NUM_KV_HEADS, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    keys = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=generator).to(dtype).float() for n in context_lens]
    values = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=generator).to(dtype).float() for n in context_lens]
    queries = [torch.randn(q, NUM_HEADS, head_dim, generator=generator).to(dtype).float() for q in query_lens]
    for table, c, k, v in zip(tables, cached_lens, keys, values):
        slots = torch.tensor(_slots(table, range(c), block_size), dtype=torch.int64)
        k_cache.view(-1, NUM_KV_HEADS, head_dim)[slots] = k[:c]
        v_cache.view(-1, NUM_KV_HEADS, head_dim)[slots] = v[:c]
    step_slots = [s for t, c, n in zip(tables, cached_lens, context_lens) for s in _slots(t, range(c, n), block_size)]
    metadata = AttentionMetadata.build(query_lens, context_lens, tables, step_slots, block_size, device)
    dense = torch.cat([dense_causal_attention(q, k, v) for q, k, v in zip(queries, keys, values)])

    def put(tensor):
        return tensor.to(device=device, dtype=dtype)

    return PagedStep(put(torch.cat(queries)), put(torch.cat([k[c:] for k, c in zip(keys, cached_lens)])),
                     put(torch.cat([v[c:] for v, c in zip(values, cached_lens)])), put(k_cache), put(v_cache),
                     metadata, dense)


def run_backend(backend, step: PagedStep) -> torch.Tensor:
    """write_kv then attend, as an attention layer does; the output in float32 on the CPU."""
    backend.write_kv(step.new_keys, step.new_values, step.k_cache, step.v_cache, step.metadata.slot_mapping)
    scale = step.query.shape[-1] ** -0.5
    return backend.attend(step.query, step.k_cache, step.v_cache, step.metadata, scale).float().cpu()
