"""Batch-invariant paged attention for the deterministic mode on the CPU: a query token's output depends only on
its own query and its sequence's keys and values up to its position, never on which other tokens share the step
(how many sequences, how many query tokens this one brings: 1 at decode, k + 1 at verify, a chunk at prefill)
or on where the sequence's KV splits into pages.

Why the reference backend is not: scaled_dot_product_attention picks its kernel and its blocking from the
shapes of the whole step (padded key length, query length, mask or none), and a GEMM's summation order follows
its shapes, so the same token's output differs in the last bits between a decode and a verify step; in bfloat16
that is enough to flip a near-tie argmax (greedy text then differs with and without speculation).

Nor is any batched form of the same arithmetic: PyTorch's CPU kernels choose their vectorization and their split
over threads from the whole tensor's shape, so softmax over the keys of one token alone and of the same token
beside five others' differs in the last bits (an AVX2 CPU shows it at the default model's shapes). So each query
token is computed alone, on tensors whose shapes are its own: its query and exactly its keys, positions 0 .. its
own. The same token then runs the same kernels on the same shapes whatever the step holds. All of it in float32.
"""
from __future__ import annotations

import torch

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend, _gather


class InvariantAttentionBackend(ReferenceAttentionBackend):
    """The reference backend's cache writes and step layout, with the batch-invariant attend above."""

    name = "invariant"

    def __init__(self):
        super().__init__()
        self._tokens_for: AttentionMetadata | None = None
        self._tokens: list[tuple[int, int]] = []

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        layout = self._layout_of(metadata)
        keys = _gather(k_cache, layout.key_slots).float()  # [batch, max_seqlen_k, num_kv_heads, head_dim]
        values = _gather(v_cache, layout.key_slots).float()
        num_kv_heads, head_dim = keys.shape[2], keys.shape[3]
        # [tokens, kv_heads, group, dim], scaled once: elementwise, so each token's bits are those of its own product
        queries = query.float().view(query.shape[0], num_kv_heads, -1, head_dim) * scale
        out = torch.empty_like(queries)
        for token, (sequence, position) in enumerate(self._tokens_of(metadata, layout)):
            scores = (queries[token] * keys[sequence, :position + 1, :, None]).sum(-1)  # [keys, kv_heads, group]
            # over the keys as the last dimension: softmax's contiguous path, a third of a token's time faster than
            # over the first
            weights = torch.softmax(scores.permute(1, 2, 0), dim=-1).permute(2, 0, 1)  # [keys, kv_heads, group]
            out[token] = (weights[..., None] * values[sequence, :position + 1, :, None]).sum(0)
        return out.view(query.shape).to(query.dtype)

    def _tokens_of(self, metadata: AttentionMetadata, layout) -> list[tuple[int, int]]:
        """Each query token's (sequence, position), built once per step and shared by the layers."""
        if self._tokens_for is not metadata:
            query_lens = (metadata.cu_seqlens_q[1:] - metadata.cu_seqlens_q[:-1]).long()
            positions = (metadata.context_lens.long() - query_lens)[layout.token_batch] + layout.token_row
            self._tokens = list(zip(layout.token_batch.tolist(), positions.tolist()))
            self._tokens_for = metadata
        return self._tokens
