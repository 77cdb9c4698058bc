"""Paged attention through flash-attn 2 (CUDA, float16 / bfloat16, block_size a multiple of 256).

Two kernels, both reading K/V straight from the paged cache through `block_table`:
- `flash_attn_with_kvcache` when every sequence feeds the same number of query tokens (all decoding,
  or all verifying the same number of drafts): q is reshaped to [batch, query_len, heads, head_dim].
- `flash_attn_varlen_func` otherwise (prompt chunks mixed with verify tokens), with cu_seqlens_q over
  the flattened queries and cu_seqlens_k over the sequences' context lengths.
With causal=True both align the mask to the bottom-right corner, so the query at position p of a
sequence with context_len keys sees keys [0, p], which is exactly our causal rule.
New keys and values are written with a plain index_copy_ beforehand, as the reference backend does.
"""
from __future__ import annotations

import torch

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:  # flash-attn is optional: select_backend only picks this backend when it imports
    flash_attn_varlen_func = flash_attn_with_kvcache = None

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


class FlashAttentionBackend:
    """flash-attn 2 paged attention (see module docstring)."""

    name = "flash-attn"

    def __init__(self):
        if flash_attn_varlen_func is None:
            raise RuntimeError("flash-attn is not importable; use the reference backend")
        self._writer = ReferenceAttentionBackend()

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 metadata: AttentionMetadata) -> None:
        """key, value [num_tokens, num_kv_heads, head_dim] -> k_cache, v_cache at metadata.slot_mapping."""
        self._writer.write_kv(key, value, k_cache, v_cache, metadata)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        if metadata.uniform_query_len:
            batched = query.view(metadata.batch_size, metadata.max_seqlen_q, *query.shape[1:])
            out = flash_attn_with_kvcache(
                batched, k_cache, v_cache, cache_seqlens=metadata.context_lens,
                block_table=metadata.block_tables, softmax_scale=scale, causal=True)
            return out.view(query.shape)
        return flash_attn_varlen_func(
            query, k_cache, v_cache,
            cu_seqlens_q=metadata.cu_seqlens_q, cu_seqlens_k=metadata.cu_seqlens_k,
            max_seqlen_q=metadata.max_seqlen_q, max_seqlen_k=metadata.max_seqlen_k,
            softmax_scale=scale, causal=True, block_table=metadata.block_tables)
