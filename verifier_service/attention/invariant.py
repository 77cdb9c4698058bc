"""Batch-invariant paged attention for the deterministic mode on the CPU: a query token's output depends only on
its own query and its sequence's keys and values up to its position, never on which other tokens share the step
(how many sequences, how many query tokens this one brings: 1 at decode, k + 1 at verify, a chunk at prefill)
or on where the sequence's KV splits into pages.

Why the reference backend is not: scaled_dot_product_attention picks its kernel and its blocking from the
shapes of the whole step (padded key length, query length, mask or none), and a GEMM's summation order follows
its shapes, so the same token's output differs in the last bits between a decode and a verify step; in bfloat16
that is enough to flip a near-tie argmax (greedy text then differs with and without speculation).

Here every reduction has one order whatever the step: scores are elementwise products summed over the head
dimension (the innermost, a fixed length), and softmax and the weighted sum of values run over the key axis, which
is not the innermost, so each output element is accumulated key by key in position order. Keys a query may not
see get a score of -inf and a weight of exactly 0, so padding adds exact zeros at the end of each sum. All of it
in float32. Query tokens go in chunks of QUERY_CHUNK, which bounds the [chunk, keys, heads, head_dim] products.
"""
from __future__ import annotations

import torch

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend, _gather

QUERY_CHUNK = 16


class InvariantAttentionBackend(ReferenceAttentionBackend):
    """The reference backend's cache writes and step layout, with the batch-invariant attend above."""

    name = "invariant"

    def __init__(self):
        super().__init__()
        self._plan_for: AttentionMetadata | None = None
        self._plan: list[tuple[slice | torch.Tensor, int | torch.Tensor, torch.Tensor]] = []

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        layout = self._layout_of(metadata)
        keys = _gather(k_cache, layout.key_slots).float()  # [batch, max_seqlen_k, num_kv_heads, head_dim]
        values = _gather(v_cache, layout.key_slots).float()
        num_kv_heads, head_dim = keys.shape[2], keys.shape[3]
        group = query.shape[1] // num_kv_heads
        queries = query.float().view(query.shape[0], num_kv_heads, group, head_dim)
        plan = self._plan_of(metadata, layout)  # (tokens, their sequence(s), the keys they may see) per chunk
        out = torch.empty_like(queries)
        for tokens, sequences, visible in plan:
            if isinstance(sequences, int):  # query tokens of one sequence: its keys as they are, shared by them all
                own_keys, own_values = keys[sequences, None, :, :, None], values[sequences, None, :, :, None]
            else:  # one query token of each of several sequences: their keys gathered per token
                own_keys = keys[sequences, :, :, None]  # [t, keys, kv_heads, 1, dim]
                own_values = values[sequences, :, :, None]
            # [t, 1, kv_heads, group, dim] * [t or 1, keys, kv_heads, 1, dim], summed over dim
            scores = (queries[tokens, None] * own_keys).sum(-1) * scale  # [t, keys, kv_heads, group]
            weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=1)
            weights = torch.where(visible, weights, 0.0)
            out[tokens] = (weights[..., None] * own_values).sum(1)
        return out.view(query.shape).to(query.dtype)

    def _plan_of(self, metadata: AttentionMetadata, layout) -> list[tuple[slice | torch.Tensor, int | torch.Tensor,
                                                                          torch.Tensor]]:
        """The step's query tokens in chunks of at most QUERY_CHUNK, each with the keys its tokens may see
        ([t, keys, 1, 1]): (the tokens, their one sequence, visible) for a sequence with several query tokens,
        (the tokens, each one's sequence, visible) for single tokens of different sequences. Built once per
        step, shared by the layers."""
        if self._plan_for is not metadata:
            query_lens = (metadata.cu_seqlens_q[1:] - metadata.cu_seqlens_q[:-1]).long()
            positions = (metadata.context_lens.long() - query_lens)[layout.token_batch] + layout.token_row
            key_index = torch.arange(metadata.max_seqlen_k, device=positions.device)
            bounds = metadata.cu_seqlens_q.tolist()
            singles = [start for start, end in zip(bounds, bounds[1:]) if end - start == 1]
            chunks: list[tuple[slice | torch.Tensor, int | torch.Tensor]] = []
            for i in range(0, len(singles), QUERY_CHUNK):
                tokens = torch.tensor(singles[i:i + QUERY_CHUNK], device=positions.device)
                chunks.append((tokens, layout.token_batch[tokens]))
            chunks += [(slice(first, min(first + QUERY_CHUNK, end)), sequence)
                       for sequence, (start, end) in enumerate(zip(bounds, bounds[1:])) if end - start > 1
                       for first in range(start, end, QUERY_CHUNK)]
            self._plan = [(tokens, sequence, (key_index[None, :] <= positions[tokens, None])[:, :, None, None])
                          for tokens, sequence in chunks]
            self._plan_for = metadata
        return self._plan
