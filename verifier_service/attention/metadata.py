"""The one attention-metadata object of a forward pass, and the context that makes it visible.

The model runner builds an AttentionMetadata per step and runs the model inside
`attention_context(metadata)`; attention layers read it with `current_attention_metadata()`, so
model code keeps the plain signature `forward(input_ids, positions)`. Contexts refuse to nest:
a forward pass inside another one is a bug, not a feature.

Terms: a step feeds each sequence a run of query tokens (a prompt chunk, or the last sampled token
followed by draft tokens). Their K/V are written to the paged cache at `slot_mapping` first; then each
query token at position p attends to its sequence's keys at positions <= p.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import torch

from verifier_service.host_copy import to_device


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot (block * block_size + offset) of each new token
    cu_seqlens_q: torch.Tensor  # [batch + 1] int32: query tokens of sequence i are [cu[i], cu[i + 1])
    cu_seqlens_k: torch.Tensor  # [batch + 1] int32: running sum of context_lens (flash-attn varlen)
    context_lens: torch.Tensor  # [batch] int32: keys visible to a sequence's last query after this step's write
    block_tables: torch.Tensor  # [batch, max_blocks] int32: KV block ids per sequence, padded with 0
    max_seqlen_q: int  # longest run of query tokens in the batch
    max_seqlen_k: int  # longest context_len in the batch, or an upper bound of it (previous_tokens.advance_on_device)
    block_size: int  # tokens per KV block

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def batch_size(self) -> int:
        return self.context_lens.shape[0]

    @property
    def uniform_query_len(self) -> bool:
        """True when every sequence feeds the same number of query tokens (e.g. all decoding k drafts)."""
        return self.num_tokens == self.batch_size * self.max_seqlen_q

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
              slot_mapping: list[int], block_size: int, device: torch.device | str) -> "AttentionMetadata":
        """Builds the tensors on the CPU and copies each to `device` once."""
        cu_q = [0]
        for n in query_lens:
            cu_q.append(cu_q[-1] + n)
        cu_k = [0]
        for n in context_lens:
            cu_k.append(cu_k[-1] + n)
        max_blocks = max(len(t) for t in block_tables)
        padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]
        return cls(
            slot_mapping=to_device(slot_mapping, torch.int64, device),
            cu_seqlens_q=to_device(cu_q, torch.int32, device),
            cu_seqlens_k=to_device(cu_k, torch.int32, device),
            context_lens=to_device(context_lens, torch.int32, device),
            block_tables=to_device(padded, torch.int32, device),
            max_seqlen_q=max(query_lens),
            max_seqlen_k=max(context_lens),
            block_size=block_size,
        )


_current: ContextVar[AttentionMetadata | None] = ContextVar("attention_metadata", default=None)


@contextmanager
def attention_context(metadata: AttentionMetadata) -> Iterator[AttentionMetadata]:
    """Makes `metadata` the one read by attention layers for the duration of a forward pass."""
    if _current.get() is not None:
        raise RuntimeError("attention_context: already inside a forward pass (contexts do not nest)")
    token = _current.set(metadata)
    try:
        yield metadata
    finally:
        _current.reset(token)


def current_attention_metadata() -> AttentionMetadata:
    """The metadata of the forward pass in progress; fails outside `attention_context`."""
    metadata = _current.get()
    if metadata is None:
        raise RuntimeError("attention metadata is not set: run the model inside attention_context()")
    return metadata
