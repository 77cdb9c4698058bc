"""What the logits processors (logits_processors.py) need for one step, built only for the requests that use them.

A batch in which no request sets a penalty or a logit bias builds nothing: SamplingMetadata.logits_processors
is None, and verification sees the model's logits untouched. Otherwise, for each logits row of the requests
that do (a request with d drafts owns d + 1 rows, row j following draft j - 1):
- output counts: how often each token occurs in the request's output *before the row's position*: the
  output so far, then this step's drafts 0..j - 1 as if emitted, which they are exactly when row j's token
  is (it is emitted only after drafts 0..j - 1 are accepted). Each row is thus adjusted as plain decoding
  would adjust that position, so speculation stays lossless under penalties (greedy and sampled alike).
- prompt tokens (repetition_penalty counts the prompt too), and (token, bias) pairs.
Everything crosses to the device as sparse (index, token) lists in two copies; the [rows, vocab] tensors
are made on the device (`output_counts`, `prompt_mask`).

Async scheduling (scheduler.schedule_ahead): a step launched before the previous step's tokens reached
the host knows the request's tokens only up to a placeholder (request.PENDING_TOKEN) that stands for the
last token the step in flight emits; before it, that step emits a prefix of its drafts
(request.pending_draft_ids). Their counts are added on the device from the step's result still there
(previous_result: last token, drafts accepted): the last token once, draft i where i < accepted. No host
sync, and the request is scheduled ahead like any other.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verifier_service.engine.batch import ScheduledRequest
from verifier_service.engine.request import Request
from verifier_service.host_copy import to_device

# The sparse lists of a step, in the order they are packed into its one int64 copy.
_INT_LISTS = ("rows", "row_request", "bias_rows", "bias_tokens", "output_requests", "output_tokens",
              "prompt_requests", "prompt_tokens", "draft_rows", "draft_tokens", "flight_requests", "flight_tokens",
              "flight_columns", "flight_results", "last_requests", "last_results")


@dataclass
class LogitsProcessorInputs:
    """One step's penalty and bias inputs, for the rows of the requests that use any ("adjusted rows")."""

    rows: torch.Tensor  # [num_adjusted] int64: the logits rows adjusted, in logits order
    row_request: torch.Tensor  # [num_adjusted] int64: the row's request, numbered among the adjusting ones
    num_requests: int  # requests that adjust their logits
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (adjusted row, token, bias float32), each [n]
    presence: torch.Tensor | None  # [num_adjusted] float32; None where no row has a presence or frequency penalty
    frequency: torch.Tensor | None  # [num_adjusted] float32 (None with presence)
    repetition: torch.Tensor | None  # [num_adjusted] float32; None where no row has a repetition penalty
    lists: dict[str, torch.Tensor]  # the sparse token lists (_INT_LISTS) on the device, for the counts
    previous_result: torch.Tensor | None  # [n, 2] (last token, drafts accepted) of the step in flight

    @staticmethod
    def build(with_logits: Sequence[tuple[int, ScheduledRequest, Request]], previous_result: torch.Tensor | None,
              device: torch.device) -> LogitsProcessorInputs | None:
        """with_logits: (batch index, scheduled entry, request) of each request with logits, in logits order.
        None when none of them sets a penalty or a logit bias: then nothing is built or copied."""
        if not any(request.params.adjusts_logits for _, _, request in with_logits):
            return None
        step = _SparseStep()
        first_row = 0
        for _, scheduled, request in with_logits:
            if request.params.adjusts_logits:
                step.add(first_row, scheduled, request)
            first_row += scheduled.num_logits
        return step.to_device(previous_result, device)

    @property
    def penalized(self) -> bool:
        return self.presence is not None or self.repetition is not None

    def output_counts(self, vocab_size: int) -> torch.Tensor:  # [num_adjusted, vocab] float32
        """Per adjusted row: each token's count in the output before the row's position (module docstring)."""
        lists = self.lists
        counts = torch.zeros(self.num_requests, vocab_size, device=self.rows.device)
        _count(counts, lists["output_requests"], lists["output_tokens"])
        if lists["last_requests"].numel():  # the step in flight's tokens, from its result on the device
            taken = self.previous_result[lists["flight_results"]]  # [num_drafts_in_flight, 2]
            accepted = (lists["flight_columns"] < taken[:, 1]).float()
            counts.index_put_((lists["flight_requests"], lists["flight_tokens"]), accepted, accumulate=True)
            _count(counts, lists["last_requests"], self.previous_result[lists["last_results"], 0])
        counts = counts[self.row_request]
        _count(counts, lists["draft_rows"], lists["draft_tokens"])
        return counts

    def prompt_mask(self, vocab_size: int) -> torch.Tensor:  # [num_adjusted, vocab] bool
        """Per adjusted row: the tokens its request's prompt holds."""
        mask = torch.zeros(self.num_requests, vocab_size, dtype=torch.bool, device=self.rows.device)
        mask[self.lists["prompt_requests"], self.lists["prompt_tokens"]] = True
        return mask[self.row_request]


class _SparseStep:
    """The host side of LogitsProcessorInputs: plain lists, one request at a time."""

    def __init__(self) -> None:
        self.ints: dict[str, list[int]] = {name: [] for name in _INT_LISTS}
        self.bias: list[float] = []
        self.presence: list[float] = []
        self.frequency: list[float] = []
        self.repetition: list[float] = []
        self.num_requests = 0

    def add(self, first_row: int, scheduled: ScheduledRequest, request: Request) -> None:
        """A request that adjusts its logits, whose rows start at first_row of the step's logits."""
        params, ints, index, num_rows = request.params, self.ints, self.num_requests, scheduled.num_logits
        first_adjusted = len(ints["rows"])
        ints["rows"] += range(first_row, first_row + num_rows)
        ints["row_request"] += [index] * num_rows
        for row in range(first_adjusted, first_adjusted + num_rows):
            ints["bias_rows"] += [row] * len(params.logit_bias)
            ints["bias_tokens"] += params.logit_bias.keys()
            self.bias += params.logit_bias.values()
        self.presence += [params.presence_penalty] * num_rows
        self.frequency += [params.frequency_penalty] * num_rows
        self.repetition += [params.repetition_penalty] * num_rows
        self.num_requests += 1
        if params.penalizes:
            self._add_tokens(index, first_adjusted, scheduled, request)

    def _add_tokens(self, index: int, first_adjusted: int, scheduled: ScheduledRequest, request: Request) -> None:
        ints = self.ints
        # What the host knows: every token but the placeholder of a step in flight (async scheduling).
        known = request.token_ids[:request.num_tokens - request.num_pending_tokens]
        prompt_len = len(request.prompt_token_ids)
        ints["output_requests"] += [index] * (len(known) - prompt_len)
        ints["output_tokens"] += known[prompt_len:]
        if request.params.repetition_penalty != 1.0:
            ints["prompt_requests"] += [index] * prompt_len
            ints["prompt_tokens"] += known[:prompt_len]
        drafts = scheduled.token_ids[scheduled.num_tokens - scheduled.num_draft_tokens:]
        for j in range(1, len(drafts) + 1):  # row j sees drafts 0..j - 1
            ints["draft_rows"] += [first_adjusted + j] * j
            ints["draft_tokens"] += drafts[:j]
        if scheduled.previous_token_row >= 0:  # the step in flight's tokens are counted on the device
            pending = request.pending_draft_ids
            ints["flight_requests"] += [index] * len(pending)
            ints["flight_tokens"] += pending
            ints["flight_columns"] += range(len(pending))
            ints["flight_results"] += [scheduled.previous_token_row] * len(pending)
            ints["last_requests"].append(index)
            ints["last_results"].append(scheduled.previous_token_row)

    def to_device(self, previous_result: torch.Tensor | None, device: torch.device) -> LogitsProcessorInputs:
        """Two copies (ints, floats); the penalty floats only where some row uses them."""
        counted = any(self.presence) or any(self.frequency)
        repeated = any(p != 1.0 for p in self.repetition)
        floats = self.bias + (self.presence + self.frequency if counted else []) + (self.repetition if repeated else [])
        ints = to_device([x for name in _INT_LISTS for x in self.ints[name]], torch.int64, device)
        lists = dict(zip(_INT_LISTS, ints.split([len(self.ints[name]) for name in _INT_LISTS])))
        num_rows = len(self.presence)
        sizes = [len(self.bias), num_rows if counted else 0, num_rows if counted else 0, num_rows if repeated else 0]
        bias, presence, frequency, repetition = to_device(floats, torch.float32, device).split(sizes)
        return LogitsProcessorInputs(
            rows=lists["rows"], row_request=lists["row_request"], num_requests=self.num_requests,
            bias=(lists["bias_rows"], lists["bias_tokens"], bias) if self.bias else None,
            presence=presence if counted else None, frequency=frequency if counted else None,
            repetition=repetition if repeated else None, lists=lists, previous_result=previous_result)


def _count(counts: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """counts[rows[i], tokens[i]] += 1 for every i (repeats add up)."""
    counts.index_put_((rows, tokens), torch.ones(rows.shape, device=counts.device), accumulate=True)
