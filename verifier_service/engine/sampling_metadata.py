"""Per-step tensors the rejection sampler needs, built once from the scheduled batch.

Rows are the logits rows: a request with d drafts owns d + 1 consecutive rows (one per draft, then the
bonus row). Padded per-request views index into them so the sampler works on the whole batch at once.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.logits_processor_inputs import LogitsProcessorInputs
from verifier_service.engine.logprobs import LogprobsPlan, plan_logprobs
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_keys import row_sampling_keys
from verifier_service.host_copy import to_device


@dataclass
class SamplingMetadata:
    batch_size: int  # requests in the scheduled batch, with logits or not
    batch_indices: list[int]  # batch position of each request that has logits
    row_index: torch.Tensor  # [num_requests, max_drafts + 1] logits row of each draft, then the bonus row
    draft_token_ids: torch.Tensor  # [num_requests, max_drafts] int64, 0 where padded
    draft_mask: torch.Tensor  # [num_requests, max_drafts] bool, True for real drafts
    row_draft: torch.Tensor  # [num_rows] int64: the draft verified at this row (0 on bonus rows)
    row_greedy: torch.Tensor  # [num_rows] bool
    row_temperature: torch.Tensor  # [num_rows] float32, 1.0 on greedy rows
    row_top_k: torch.Tensor  # [num_rows] int64, 0 (off) on greedy rows
    row_top_p: torch.Tensor  # [num_rows] float32, 1 (off) on greedy rows
    row_min_p: torch.Tensor  # [num_rows] float32, 0 (off) on greedy rows
    all_greedy: bool
    row_keys: torch.Tensor | None  # [num_rows] int64: (seed, output position) keys (sampling_keys.py); None if all greedy
    use_top_k: bool = True  # some row filters by top-k / top-p / min-p (known on the host: no sync to ask)
    use_top_p: bool = True
    use_min_p: bool = True
    logprobs: LogprobsPlan | None = None  # rows that need log-probabilities (None: no request asked)
    logits_processors: LogitsProcessorInputs | None = None  # penalties and logit bias; None: nobody uses any

    @classmethod
    def build(cls, batch: ScheduledBatch, requests: Sequence[Request], device: torch.device) -> SamplingMetadata:
        """requests: the engine's Request of each batch entry, in batch order."""
        with_logits = [(i, s, r) for i, (s, r) in enumerate(zip(batch.requests, requests)) if s.num_logits]
        max_drafts = max((s.num_draft_tokens for _, s, _ in with_logits), default=0)
        row_index, drafts, row_draft = [], [], []
        per_request_params, counts = [], []
        first_row = 0
        for _, scheduled, request in with_logits:
            num_drafts = scheduled.num_draft_tokens
            draft = scheduled.token_ids[len(scheduled.token_ids) - num_drafts:]
            row_index.append([first_row + min(j, num_drafts) for j in range(max_drafts + 1)])
            drafts.append(draft + [0] * (max_drafts - num_drafts))
            row_draft += draft + [0]
            params = request.params
            per_request_params.append((params.greedy, *params.target))  # greedy rows: no filters, T = 1
            counts.append(num_drafts + 1)
            first_row += num_drafts + 1
        greedy, temperature, top_k, top_p, min_p = zip(*per_request_params) if per_request_params else ((),) * 5
        num_requests, num_rows = len(with_logits), first_row

        def per_row(values):  # one value per request -> one per row
            return [v for v, n in zip(values, counts) for _ in range(n)]

        # Two pinned, non-blocking copies (ints, floats) instead of one blocking copy per tensor: no host sync.
        ints = [x for row in row_index for x in row] + [x for row in drafts for x in row]
        ints += [int(j < n - 1) for n in counts for j in range(max_drafts)]
        ints += row_draft + per_row([int(g) for g in greedy]) + per_row(top_k)
        floats = per_row(temperature) + per_row(top_p) + per_row(min_p)
        ints_device = to_device(ints, torch.int64, device)
        floats_device = to_device(floats, torch.float32, device)
        padded = num_requests * (max_drafts + 1), num_requests * max_drafts, num_requests * max_drafts
        index, draft_ids, mask, row_draft_t, greedy_t, top_k_t = ints_device.split(
            [*padded, num_rows, num_rows, num_rows])
        temperature_t, top_p_t, min_p_t = floats_device.split([num_rows] * 3)
        return cls(
            batch_size=len(batch.requests),
            batch_indices=[i for i, _, _ in with_logits],
            row_index=index.view(num_requests, max_drafts + 1),
            draft_token_ids=draft_ids.view(num_requests, max_drafts),
            draft_mask=mask.view(num_requests, max_drafts).bool(),
            row_draft=row_draft_t,
            row_greedy=greedy_t.bool(),
            row_temperature=temperature_t,
            row_top_k=top_k_t,
            row_top_p=top_p_t,
            row_min_p=min_p_t,
            all_greedy=all(greedy),
            row_keys=None if all(greedy) else row_sampling_keys(batch, requests, device),
            use_top_k=any(k > 0 for k in top_k),
            use_top_p=any(p < 1.0 for p in top_p),
            use_min_p=any(p > 0.0 for p in min_p),
            logprobs=plan_logprobs([(s.num_draft_tokens, r.params) for _, s, r in with_logits], max_drafts, device),
            logits_processors=LogitsProcessorInputs.build(with_logits, batch.previous_result, device),
        )
