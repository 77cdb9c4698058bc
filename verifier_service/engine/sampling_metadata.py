"""Per-step tensors the rejection sampler needs, built once from the scheduled batch.

Rows are the logits rows: a request with d drafts owns d + 1 consecutive rows (one per draft, then the
bonus row). Padded per-request views index into them so the sampler works on the whole batch at once.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.request import Request


@dataclass
class SamplingMetadata:
    batch_size: int  # requests in the scheduled batch, with logits or not
    batch_indices: list[int]  # batch position of each request that has logits
    row_index: torch.Tensor  # [num_requests, max_drafts + 1] logits row of each draft, then the bonus row
    draft_token_ids: torch.Tensor  # [num_requests, max_drafts] int64, 0 where padded
    draft_mask: torch.Tensor  # [num_requests, max_drafts] bool, True for real drafts
    row_draft: torch.Tensor  # [num_rows] int64: the draft verified at this row (0 on bonus rows)
    row_has_draft: torch.Tensor  # [num_rows] bool: False on bonus rows
    row_greedy: torch.Tensor  # [num_rows] bool
    row_temperature: torch.Tensor  # [num_rows] float32, 1.0 on greedy rows
    row_top_k: torch.Tensor  # [num_rows] int64
    row_top_p: torch.Tensor  # [num_rows] float32
    row_min_p: torch.Tensor  # [num_rows] float32
    all_greedy: bool
    seeded_rows: list[tuple[int, int, torch.Generator]]  # (first row, row count, the request's generator)

    @classmethod
    def build(cls, batch: ScheduledBatch, requests: Sequence[Request], device: torch.device) -> SamplingMetadata:
        """requests: the engine's Request of each batch entry, in batch order."""
        with_logits = [(i, s, r) for i, (s, r) in enumerate(zip(batch.requests, requests)) if s.num_logits]
        max_drafts = max((s.num_draft_tokens for _, s, _ in with_logits), default=0)
        row_index, drafts, row_draft, has_draft, seeded = [], [], [], [], []
        per_request_params, counts = [], []
        first_row = 0
        for _, scheduled, request in with_logits:
            num_drafts = scheduled.num_draft_tokens
            draft = scheduled.token_ids[len(scheduled.token_ids) - num_drafts:]
            row_index.append([first_row + min(j, num_drafts) for j in range(max_drafts + 1)])
            drafts.append(draft + [0] * (max_drafts - num_drafts))
            row_draft += draft + [0]
            has_draft += [True] * num_drafts + [False]
            params = request.params
            per_request_params.append((params.greedy, params.temperature if not params.greedy else 1.0,
                                       params.top_k, params.top_p, params.min_p))
            counts.append(num_drafts + 1)
            if request.generator is not None:
                seeded.append((first_row, num_drafts + 1, request.generator))
            first_row += num_drafts + 1
        greedy, temperature, top_k, top_p, min_p = zip(*per_request_params) if per_request_params else ((),) * 5
        repeats = torch.tensor(counts, dtype=torch.long)

        def rows(values, dtype):  # one value per request -> one per row
            return torch.tensor(values, dtype=dtype).repeat_interleave(repeats).to(device)

        draft_tensor = torch.tensor(drafts, dtype=torch.long).reshape(len(with_logits), max_drafts)
        return cls(
            batch_size=len(batch.requests),
            batch_indices=[i for i, _, _ in with_logits],
            row_index=torch.tensor(row_index, dtype=torch.long).reshape(-1, max_drafts + 1).to(device),
            draft_token_ids=draft_tensor.to(device),
            draft_mask=(torch.arange(max_drafts).unsqueeze(0)
                        < (repeats - 1).unsqueeze(1)).to(device),
            row_draft=torch.tensor(row_draft, dtype=torch.long).to(device),
            row_has_draft=torch.tensor(has_draft, dtype=torch.bool).to(device),
            row_greedy=rows(greedy, torch.bool),
            row_temperature=rows(temperature, torch.float32),
            row_top_k=rows(top_k, torch.long),
            row_top_p=rows(top_p, torch.float32),
            row_min_p=rows(min_p, torch.float32),
            all_greedy=all(greedy),
            seeded_rows=seeded,
        )

    def random_draws(self, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """uniform [num_rows] for acceptance, exponential [num_rows, vocab] for the exponential race.

        Rows of a seeded request come from its own generator, so its output does not depend on what
        else is in the batch.
        """
        num_rows = self.row_draft.shape[0]
        uniform = torch.rand(num_rows, device=device)
        exponential = torch.empty(num_rows, vocab_size, device=device).exponential_()
        for first, count, generator in self.seeded_rows:
            uniform[first:first + count] = torch.rand(count, device=device, generator=generator)
            exponential[first:first + count].exponential_(generator=generator)
        return uniform, exponential
