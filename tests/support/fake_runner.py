"""A tiny model runner for engine-logic tests: pages token ids instead of keys and values.

It keeps the same contract as verifier_service.engine.model_runner.ModelRunner: execute(batch) writes each
scheduled token into its KV slot and returns float32 logits [batch.num_logits, vocab]. The logits of a
position are a pseudo-random function of every token up to it, read back through the block table, so a
wrong block table, a block overwritten while shared, or a stale prefix-cache hit changes the output.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from verifier_service.engine.batch import ScheduledBatch


def context_logits(context: Sequence[int], vocab_size: int) -> torch.Tensor:  # [vocab]
    """The fake model: logits that depend on the whole context (deterministic)."""
    generator = torch.Generator().manual_seed(hash(tuple(context)) % 2**62)
    return 3.0 * torch.randn(vocab_size, generator=generator)


def greedy_reference(prompt: Sequence[int], num_tokens: int, vocab_size: int) -> list[int]:
    """Plain greedy decoding with the fake model, no paging: what the engine must reproduce."""
    sequence = list(prompt)
    for _ in range(num_tokens):
        sequence.append(int(context_logits(sequence, vocab_size).argmax()))
    return sequence[len(prompt):]


class FakePagedRunner:
    def __init__(self, num_blocks: int = 64, block_size: int = 4, vocab_size: int = 32,
                 max_model_len: int = 256) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.device = torch.device("cpu")
        self.slots = [-1] * (num_blocks * block_size)  # the "KV cache": the token id at each slot
        self.num_computed_tokens = 0  # tokens fed through execute, to see prefix-cache hits
        self.num_previous_tokens_fed = 0  # first tokens taken from the previous step's device result
        self.num_advances_fed = 0  # entries whose start moved by drafts the previous step accepted

    def execute(self, batch: ScheduledBatch) -> torch.Tensor:
        rows = []
        for request in batch.requests:
            token_ids, start = list(request.token_ids), request.start_position
            if request.previous_token_row >= 0:  # async scheduling: continues from the previous step's result
                last_token, num_accepted = batch.previous_result[request.previous_token_row].tolist()
                token_ids[0], start = last_token, start + num_accepted
                self.num_previous_tokens_fed += 1
                self.num_advances_fed += num_accepted > 0
            context_len = start + len(token_ids)
            assert len(request.block_table) * self.block_size >= context_len, "block table too short"
            for offset, token in enumerate(token_ids):
                self.slots[self._slot(request.block_table, start + offset)] = token
            self.num_computed_tokens += request.num_tokens
            for position in range(context_len - request.num_logits, context_len):
                context = [self.slots[self._slot(request.block_table, p)] for p in range(position + 1)]
                rows.append(context_logits(context, self.vocab_size))
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)

    def _slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
