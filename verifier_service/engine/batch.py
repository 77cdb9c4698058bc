"""What the scheduler hands to the model runner for one forward pass.

Draft tokens are simply extra scheduled tokens: a decoding request feeds [last token] + drafts, a
prefilling request feeds a chunk of its prompt. Every request's tokens are contiguous in the
flattened batch, in the order of `requests`.

With async scheduling a step is scheduled while the previous one still runs, so a request that the
previous step emits tokens for continues from a result the host has not seen yet: its token_ids[0] is a
placeholder for the last token the previous step emits, and its start_position assumes that step accepted
none of its drafts. `previous_token_row` says which row of `previous_result` (on the device) holds the real
token and the number of drafts accepted, which the runner adds to the positions on the device
(previous_tokens.py). Once the host has the previous step's tokens, the engine resolves the entry
(`resolve_previous`), so that update() sees the real start and token.
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
    previous_token_row: int = -1  # >= 0: continues from row previous_token_row of the batch's previous_result
    previous_num_drafts: int = 0  # drafts the previous step scored for this request: it advances by 0..this many

    def resolve_previous(self, last_token: int, num_accepted: int) -> None:
        """The previous step's result reached the host: the real first token and start position."""
        self.token_ids[0] = last_token
        self.start_position += num_accepted
        self.previous_token_row, self.previous_num_drafts = -1, 0

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
    # [n, 2] int64 on the device: per row of the previous step, (last token it emits, drafts it accepted)
    previous_result: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def num_logits(self) -> int:
        return sum(r.num_logits for r in self.requests)

    def __bool__(self) -> bool:
        return bool(self.requests)
