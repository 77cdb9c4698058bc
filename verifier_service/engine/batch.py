"""What the scheduler hands to the model runner for one forward pass.

Draft tokens are simply extra scheduled tokens: a decoding request feeds [last token] + drafts, a
prefilling request feeds a chunk of its prompt. Every request's tokens are contiguous in the
flattened batch, in the order of `requests`.

With async scheduling a step is scheduled while the previous one still runs, so a request's first token
may be one the device has sampled but the host has not seen yet: its token_ids[0] is then a placeholder
and `previous_token_row` says which entry of `previous_tokens` (on the device) the runner feeds instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ScheduledRequest:
    request_id: str
    token_ids: list[int]  # fed this step: real tokens (prompt chunk, or the last sampled token), then drafts
    start_position: int  # position of token_ids[0]; equals the request's tokens already in the KV cache
    block_table: list[int]  # KV block ids covering positions [0, start_position + len(token_ids))
    num_draft_tokens: int  # trailing entries of token_ids that are drafts
    num_logits: int  # trailing positions that need logits: 0 (a chunk before the prompt's end) or 1 + drafts
    previous_token_row: int = -1  # >= 0: token_ids[0] is the batch's previous_tokens[previous_token_row]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Keys visible to the last query token after this step's KV write."""
        return self.start_position + len(self.token_ids)


@dataclass
class ScheduledBatch:
    requests: list[ScheduledRequest]
    previous_tokens: torch.Tensor | None = None  # [n] int64 on the device: tokens the previous step sampled

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def num_logits(self) -> int:
        return sum(r.num_logits for r in self.requests)

    def __bool__(self) -> bool:
        return bool(self.requests)
