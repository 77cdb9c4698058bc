"""Paged attention in plain PyTorch: runs on any device, and is the yardstick for faster backends.

Every sequence's keys are gathered through its block table into a padded [batch, max_seqlen_k] view,
queries are padded to [batch, max_seqlen_q], and one scaled_dot_product_attention call does the whole
batch under a mask that lets the query at position p see keys at positions <= p of its own sequence
(which covers prompt chunks and several draft tokens per sequence alike). The gather indices and the
mask depend only on the step, so they are built once per step and reused by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verifier_service.attention.metadata import AttentionMetadata


@dataclass
class _StepLayout:
    key_slots: torch.Tensor  # [batch, max_seqlen_k] int64: cache slot of each sequence's j-th key
    mask: torch.Tensor | None  # [batch, 1, max_seqlen_q, max_seqlen_k] bool: True where the query may attend
    is_causal: bool  # the mask is plain top-left causal (one fresh prompt), so SDPA needs no mask tensor
    token_batch: torch.Tensor  # [num_tokens]: sequence index of each query token
    token_row: torch.Tensor  # [num_tokens]: index of each query token within its sequence's run


def step_layout(metadata: AttentionMetadata) -> _StepLayout:
    """Gather indices and causal mask of one step (shared by all layers)."""
    device = metadata.block_tables.device
    query_lens = (metadata.cu_seqlens_q[1:] - metadata.cu_seqlens_q[:-1]).long()  # [batch]
    key_index = torch.arange(metadata.max_seqlen_k, device=device)  # [max_seqlen_k]
    blocks = metadata.block_tables.long()[:, key_index // metadata.block_size]  # [batch, max_seqlen_k]
    key_slots = blocks * metadata.block_size + key_index % metadata.block_size
    # Query row r of sequence b sits at position context_len - query_len + r; padded rows see key 0 only.
    rows = torch.arange(metadata.max_seqlen_q, device=device)  # [max_seqlen_q]
    query_pos = (metadata.context_lens.long() - query_lens)[:, None] + rows  # [batch, max_seqlen_q]
    query_pos = torch.where(rows < query_lens[:, None], query_pos, 0)
    mask = key_index[None, None, :] <= query_pos[:, :, None]  # [batch, max_seqlen_q, max_seqlen_k]
    token_batch = torch.repeat_interleave(
        torch.arange(metadata.batch_size, device=device), query_lens, output_size=metadata.num_tokens)
    token_row = torch.arange(metadata.num_tokens, device=device) - metadata.cu_seqlens_q.long()[token_batch]
    exact = metadata.batch_size == 1 and int(metadata.context_lens[0]) == metadata.max_seqlen_k  # not a bound
    if exact and metadata.max_seqlen_q in (1, metadata.max_seqlen_k):
        # Batch-1 decode sees every key; a batch-1 fresh prompt is SDPA's own causal case. Only where max_seqlen_k
        # is the sequence's own length: a step advanced on the device (previous_tokens.py) has an upper bound there.
        return _StepLayout(key_slots, None, metadata.max_seqlen_q > 1, token_batch, token_row)
    return _StepLayout(key_slots, mask.unsqueeze(1), False, token_batch, token_row)


def _gather(cache: torch.Tensor, key_slots: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, kv_heads, head_dim] rows at key_slots [batch, max_k] -> [batch, max_k, kv_heads, head_dim]."""
    rows = cache.view(-1, *cache.shape[2:]).index_select(0, key_slots.view(-1))
    return rows.view(*key_slots.shape, *cache.shape[2:])


class ReferenceAttentionBackend:
    """PyTorch paged attention (see module docstring)."""

    name = "reference"

    def __init__(self):
        self._layout_for: AttentionMetadata | None = None
        self._layout: _StepLayout | None = None

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """key, value [num_tokens, num_kv_heads, head_dim] -> k_cache, v_cache at slot_mapping [num_tokens]."""
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        layout = self._layout_of(metadata)
        keys = _gather(k_cache, layout.key_slots)  # [batch, max_seqlen_k, num_kv_heads, head_dim]
        values = _gather(v_cache, layout.key_slots)
        if metadata.batch_size == 1:  # the common batch-1 decode: no padding to do
            padded = query.unsqueeze(0)
        else:
            padded = query.new_zeros(metadata.batch_size, metadata.max_seqlen_q, *query.shape[1:])
            padded[layout.token_batch, layout.token_row] = query
        out = F.scaled_dot_product_attention(
            padded.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=layout.mask, is_causal=layout.is_causal, scale=scale, enable_gqa=True,
        ).transpose(1, 2)  # [batch, max_q, num_heads, head_dim]
        if metadata.batch_size == 1:
            return out[0]
        return out[layout.token_batch, layout.token_row]

    def _layout_of(self, metadata: AttentionMetadata) -> _StepLayout:
        if self._layout_for is not metadata:
            self._layout, self._layout_for = step_layout(metadata), metadata
        return self._layout
