"""Log-probabilities of the emitted tokens, from the logits the verify step already has (no extra forward).

A request that asks (SamplingParams.logprobs = N, 0..20) gets, for each emitted token, the target model's
log-probability of that token at its position and the N most likely tokens there. Speculated and plain steps
alike: the rows of accepted drafts and of the recovered or bonus token are scored positions like any other.

Which distribution (SamplingParams.logprobs_mode):
- "raw" (the default, as vLLM's default logprobs_mode=raw_logprobs): log_softmax of the model's logits,
  before penalties, temperature and top-k / top-p / min-p. Taken when verify_async starts, before anything
  processes the logits.
- "processed": the distribution the token is drawn from: the logits as verify_async has processed them
  (penalties, logit bias), divided by the temperature, and renormalised over the tokens that top-k / top-p /
  min-p keep; the others are -inf and left out of the top N. A greedy request's processed distribution is
  the processed logits at temperature 1 without filters: the one whose argmax it takes.

Rows: all d + 1 rows of each request that asked. How many of them are emitted (num_accepted + 1) is known
on the device only, so all are computed and the host keeps the emitted ones when it unpacks. The results are
copied to the host right behind the step's token copy. A step in which nobody asked has no plan
(SamplingMetadata.logprobs is None) and does no work here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specd.sampling import SamplingParams
from verifier_service.engine.outputs import TokenLogprobs
from verifier_service.engine.sampling import target_scores
from verifier_service.host_copy import to_device


@dataclass(frozen=True)
class ProcessedRows:
    """The plan rows whose request wants the processed distribution, with the parameters it samples with."""

    plan_rows: torch.Tensor  # [p] int64: positions among the plan's rows
    temperature: torch.Tensor  # [p] float32 (1.0 for greedy requests)
    top_k: torch.Tensor  # [p] int64, 0 = off
    top_p: torch.Tensor  # [p] float32, 1 = off
    min_p: torch.Tensor  # [p] float32, 0 = off
    filters: tuple[bool, bool, bool]  # whether any row uses top-k, top-p, min-p (known on the host)


@dataclass(frozen=True)
class LogprobsPlan:
    """Which logits rows of a step get log-probabilities; built on the host with the sampling metadata."""

    rows: torch.Tensor  # [m] int64: the logits row of each plan row
    output_index: torch.Tensor  # [m] int64: that row's token in verify_async's flattened [requests, max_drafts + 1] output
    num_top: int  # the most alternatives any request of the step asked for
    requests: list[tuple[int, int, int]]  # per request that asked: (index among requests with logits, first plan row, N)
    processed: ProcessedRows | None  # None: every request that asked takes the raw distribution


def plan_logprobs(scored: Sequence[tuple[int, SamplingParams]], max_drafts: int,
                  device: torch.device) -> LogprobsPlan | None:
    """scored: (drafts, params) of each request with logits, in row order. None when none asked."""
    if all(params.logprobs is None for _, params in scored):
        return None
    rows, output_index, requests, processed = [], [], [], []
    first_row = 0
    for index, (num_drafts, params) in enumerate(scored):
        if params.logprobs is not None:
            if params.logprobs_mode == "processed":
                processed += [(len(rows) + j, params) for j in range(num_drafts + 1)]
            requests.append((index, len(rows), params.logprobs))
            rows += range(first_row, first_row + num_drafts + 1)
            output_index += range(index * (max_drafts + 1), index * (max_drafts + 1) + num_drafts + 1)
        first_row += num_drafts + 1
    indices = to_device(rows + output_index, torch.int64, device).view(2, -1)
    return LogprobsPlan(indices[0], indices[1], max(n for _, _, n in requests), requests,
                        _processed_rows(processed, device) if processed else None)


def _processed_rows(processed: list[tuple[int, SamplingParams]], device: torch.device) -> ProcessedRows:
    temperature, top_k, top_p, min_p = zip(*(params.target for _, params in processed))
    ints = to_device([row for row, _ in processed] + list(top_k), torch.int64, device).view(2, -1)
    floats = to_device(temperature + top_p + min_p, torch.float32, device).view(3, -1)
    filters = any(k > 0 for k in top_k), any(p < 1.0 for p in top_p), any(p > 0.0 for p in min_p)
    return ProcessedRows(ints[0], floats[0], ints[1], floats[1], floats[2], filters)


def raw_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab] as the model scored them (bf16 on CUDA)
    plan: LogprobsPlan | None,
) -> torch.Tensor | None:  # [m, vocab] float32
    """The raw distribution of the plan's rows (to be taken before anything processes the logits)."""
    return None if plan is None else logits.index_select(0, plan.rows).float().log_softmax(dim=-1)


def emitted_logprobs(
    raw: torch.Tensor | None,  # [m, vocab]: raw_logprobs of the same step
    logits: torch.Tensor,  # [num_rows, vocab], as verification used them (processed)
    output: torch.Tensor,  # [num_requests, max_drafts + 1] int64: the token emitted at each column
    plan: LogprobsPlan | None,
) -> DeviceLogprobs | None:
    """Each plan row's token logprob and top N, still on the device."""
    if plan is None:
        return None
    logprobs = raw
    if plan.processed is not None:
        processed = plan.processed
        rows = logits.index_select(0, plan.rows.index_select(0, processed.plan_rows)).float()
        logprobs = logprobs.index_copy(0, processed.plan_rows, _processed_logprobs(rows, processed))
    tokens = output.flatten().index_select(0, plan.output_index)  # [m]
    chosen = logprobs.gather(1, tokens.unsqueeze(1))  # [m, 1]
    top = logprobs.topk(plan.num_top, dim=-1)  # sorted, most likely first
    return DeviceLogprobs(torch.cat([chosen, top.values], dim=1), top.indices, plan)


def _processed_logprobs(
    logits: torch.Tensor,  # [p, vocab]
    rows: ProcessedRows,
) -> torch.Tensor:  # [p, vocab], -inf where the filters remove a token
    scores = target_scores(logits, rows.temperature, rows.top_k, rows.top_p, rows.min_p, rows.filters)
    return scores.log_softmax(dim=-1)  # the distribution the sampler draws from


class DeviceLogprobs:
    """A step's log-probabilities: computed on the device, copied to the host, unpacked per request."""

    def __init__(self, values: torch.Tensor, top_ids: torch.Tensor, plan: LogprobsPlan) -> None:
        self.values = values  # [m, 1 + num_top] float32: the emitted token's logprob, then the top N
        self.top_ids = top_ids  # [m, num_top] int64
        self.plan = plan

    def copy_to_host(self) -> None:
        """Queues non-blocking copies into pinned memory (CUDA); the caller's event covers them."""
        self.values, self.top_ids = _pinned_copy(self.values), _pinned_copy(self.top_ids)

    def per_request(self, token_ids: list[list[int]], batch_indices: list[int]) -> list[list[TokenLogprobs] | None]:
        """token_ids: each batch request's emitted tokens (VerifiedTokens.token_ids); one entry per emitted
        token for the requests that asked, None for the others. Call after the step's copy is complete."""
        values, top_ids = self.values.tolist(), self.top_ids.tolist()
        logprobs: list[list[TokenLogprobs] | None] = [None] * len(token_ids)
        for index, first_row, num_top in self.plan.requests:
            batch_index = batch_indices[index]
            logprobs[batch_index] = [
                _token_logprobs(token, values[first_row + column], top_ids[first_row + column], num_top)
                for column, token in enumerate(token_ids[batch_index])]
        return logprobs


def _token_logprobs(token_id: int, values: list[float], top_ids: list[int], num_top: int) -> TokenLogprobs:
    top = tuple((top_ids[i], values[1 + i]) for i in range(num_top) if values[1 + i] != float("-inf"))
    return TokenLogprobs(token_id, values[0], top)


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)
