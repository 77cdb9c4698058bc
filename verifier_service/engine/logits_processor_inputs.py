"""What the logits processors (logits_processors.py) need for one step, built only for the requests that use them.

A batch in which no request sets a penalty or a logit bias builds nothing: SamplingMetadata.logits_processors
is None, and verification sees the model's logits untouched. Otherwise, for the requests that do (a request
with d drafts owns d + 1 logits rows, row j following draft j - 1):
- output counts: how often each token occurs in the request's output *before the row's position*: the
  output so far, then this step's drafts 0..j - 1 as if emitted, which they are exactly when row j's token
  is (it is emitted only after drafts 0..j - 1 are accepted). Each row is thus adjusted as plain decoding
  would adjust that position, so speculation stays lossless under penalties (greedy and sampled alike).
  Kept per request ([requests, vocab], `output_counts`) plus each row's drafts before it (`draft_before`).
- the prompt's tokens (repetition_penalty counts the prompt too, `prompt_mask`), and (row, token, bias).
- candidates: per request, every token a penalty may change (prompt if repeated, output, drafts, drafts in
  flight): penalties are applied at these [rows, candidates] entries only, not over the whole vocabulary.
Everything crosses to the device as int lists in one copy and floats in another.

Async scheduling (scheduler.schedule_ahead): a step launched before the previous step's tokens reached
the host knows the request's tokens only up to a placeholder (request.PENDING_TOKEN) that stands for the
last token the step in flight emits; before it, that step emits a prefix of its drafts
(request.pending_draft_ids). They are counted on the device from the step's result still there
(previous_result: last token, drafts accepted): the last token once, draft i where i < accepted. No host
sync, and the request is scheduled ahead like any other.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from verifier_service.engine.batch import ScheduledRequest
from verifier_service.engine.request import Request
from verifier_service.host_copy import to_device

# The sparse lists of a step, in the order they are packed into its one int64 copy.
_INT_LISTS = ("rows", "row_request", "bias_rows", "bias_tokens", "output_requests", "output_tokens",
              "prompt_requests", "prompt_tokens", "flight_requests", "flight_tokens", "flight_columns",
              "flight_results", "last_requests", "last_results", "candidates", "draft_before")
IN_FLIGHT_COLUMN = 0  # the candidates' column of the token the step in flight emits last (filled on the device)
NO_TOKEN = -1  # draft_before's padding


@dataclass
class LogitsProcessorInputs:
    """One step's penalty and bias inputs, for the rows of the requests that use any ("adjusted rows")."""

    rows: torch.Tensor  # [num_adjusted] int64: the logits rows adjusted, in logits order
    row_request: torch.Tensor  # [num_adjusted] int64: the row's request, numbered among the adjusting ones
    num_requests: int  # requests that adjust their logits
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (logits row, token, bias float32), each [n]
    presence: torch.Tensor | None  # [num_adjusted] float32; None where no row has a presence or frequency penalty
    frequency: torch.Tensor | None  # [num_adjusted] float32 (None with presence)
    repetition: torch.Tensor | None  # [num_adjusted] float32; None where no row has a repetition penalty
    lists: dict[str, torch.Tensor]  # the sparse token lists (_INT_LISTS) on the device
    candidates: torch.Tensor  # [num_requests, width] int64: tokens a penalty may change (0 pads: harmless)
    draft_before: torch.Tensor  # [num_adjusted, max_drafts] int64: the row's drafts before it, NO_TOKEN after
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

    def output_counts(self, vocab_size: int) -> torch.Tensor:  # [num_requests, vocab] float32
        """Per request: each token's count in its output, the tokens of the step in flight included."""
        lists = self.lists
        counts = torch.zeros(self.num_requests, vocab_size, device=self.rows.device)
        _count(counts, lists["output_requests"], lists["output_tokens"])
        if lists["last_requests"].numel():  # the step in flight's tokens, from its result on the device
            taken = self.previous_result[lists["flight_results"]]  # [num_drafts_in_flight, 2]
            accepted = (lists["flight_columns"] < taken[:, 1]).float()
            counts.index_put_((lists["flight_requests"], lists["flight_tokens"]), accepted, accumulate=True)
            _count(counts, lists["last_requests"], self.last_tokens())
        return counts

    def prompt_mask(self, vocab_size: int) -> torch.Tensor:  # [num_requests, vocab] bool
        """Per request: the tokens its prompt holds."""
        mask = torch.zeros(self.num_requests, vocab_size, dtype=torch.bool, device=self.rows.device)
        mask[self.lists["prompt_requests"], self.lists["prompt_tokens"]] = True
        return mask

    def row_candidates(self) -> torch.Tensor:  # [num_adjusted, width] int64
        """Per adjusted row: its request's candidates, with the token in flight (on the device) in its column."""
        candidates = self.candidates
        if self.lists["last_requests"].numel():
            candidates = candidates.clone()
            candidates[self.lists["last_requests"], IN_FLIGHT_COLUMN] = self.last_tokens()
        return candidates[self.row_request]

    def last_tokens(self) -> torch.Tensor:  # [num_last] int64
        """The last token the step in flight emits, per request continuing from it (still on the device)."""
        return self.previous_result[self.lists["last_results"], 0]


class _SparseStep:
    """The host side of LogitsProcessorInputs: plain lists, one request at a time."""

    def __init__(self) -> None:
        self.ints: dict[str, list[int]] = {name: [] for name in _INT_LISTS}
        self.candidates: list[list[int]] = []  # per request
        self.draft_before: list[list[int]] = []  # per adjusted row
        self.bias: list[float] = []
        self.presence: list[float] = []
        self.frequency: list[float] = []
        self.repetition: list[float] = []

    def add(self, first_row: int, scheduled: ScheduledRequest, request: Request) -> None:
        """A request that adjusts its logits, whose rows start at first_row of the step's logits."""
        params, ints, index, num_rows = request.params, self.ints, len(self.candidates), scheduled.num_logits
        ints["rows"] += range(first_row, first_row + num_rows)
        ints["row_request"] += [index] * num_rows
        for row in range(first_row, first_row + num_rows):
            ints["bias_rows"] += [row] * len(params.logit_bias)
            ints["bias_tokens"] += params.logit_bias.keys()
            self.bias += params.logit_bias.values()
        self.presence += [params.presence_penalty] * num_rows
        self.frequency += [params.frequency_penalty] * num_rows
        self.repetition += [params.repetition_penalty] * num_rows
        drafts = scheduled.token_ids[scheduled.num_tokens - scheduled.num_draft_tokens:]
        self.draft_before += [drafts[:j] for j in range(num_rows)] if params.penalizes else [[]] * num_rows
        self.candidates.append(self._tokens(index, scheduled, request, drafts) if params.penalizes else [])

    def _tokens(self, index: int, scheduled: ScheduledRequest, request: Request, drafts: list[int]) -> list[int]:
        """Lists the request's counted tokens; returns its candidates (IN_FLIGHT_COLUMN first)."""
        ints = self.ints
        # What the host knows: every token but the placeholder of a step in flight (async scheduling).
        known = request.token_ids[:request.num_tokens - request.num_pending_tokens]
        # A resumed stream's prompt ends with its own earlier output (gateway/resume.py): output here too.
        prompt_len = len(request.prompt_token_ids) - request.params.output_position_offset
        ints["output_requests"] += [index] * (len(known) - prompt_len)
        ints["output_tokens"] += known[prompt_len:]
        repeated = request.params.repetition_penalty != 1.0
        if repeated:
            ints["prompt_requests"] += [index] * prompt_len
            ints["prompt_tokens"] += known[:prompt_len]
        pending = []
        if scheduled.previous_token_row >= 0:  # the step in flight's tokens are counted on the device
            pending = request.pending_draft_ids
            ints["flight_requests"] += [index] * len(pending)
            ints["flight_tokens"] += pending
            ints["flight_columns"] += range(len(pending))
            ints["flight_results"] += [scheduled.previous_token_row] * len(pending)
            ints["last_requests"].append(index)
            ints["last_results"].append(scheduled.previous_token_row)
        return [0] + (known if repeated else known[prompt_len:]) + pending + drafts

    def to_device(self, previous_result: torch.Tensor | None, device: torch.device) -> LogitsProcessorInputs:
        """Two copies (ints, floats); the penalty floats only where some row uses them."""
        ints = self.ints
        width = max(map(len, self.candidates))
        ints["candidates"] = list(chain.from_iterable(tokens + [0] * (width - len(tokens))
                                                      for tokens in self.candidates))
        max_drafts = max(map(len, self.draft_before))
        ints["draft_before"] = list(chain.from_iterable(before + [NO_TOKEN] * (max_drafts - len(before))
                                                        for before in self.draft_before))
        packed = to_device(list(chain.from_iterable(ints[name] for name in _INT_LISTS)), torch.int64, device)
        lists = dict(zip(_INT_LISTS, packed.split([len(ints[name]) for name in _INT_LISTS])))
        counted = any(self.presence) or any(self.frequency)
        repeated = any(p != 1.0 for p in self.repetition)
        floats = self.bias + (self.presence + self.frequency if counted else []) + (self.repetition if repeated else [])
        num_rows = len(self.presence)
        sizes = [len(self.bias), num_rows if counted else 0, num_rows if counted else 0, num_rows if repeated else 0]
        bias, presence, frequency, repetition = to_device(floats, torch.float32, device).split(sizes)
        return LogitsProcessorInputs(
            rows=lists["rows"], row_request=lists["row_request"], num_requests=len(self.candidates),
            bias=(lists["bias_rows"], lists["bias_tokens"], bias) if self.bias else None,
            presence=presence if counted else None, frequency=frequency if counted else None,
            repetition=repetition if repeated else None, lists=lists,
            candidates=lists["candidates"].view(len(self.candidates), width),
            draft_before=lists["draft_before"].view(num_rows, max_drafts), previous_result=previous_result)


def _count(counts: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """counts[rows[i], tokens[i]] += 1 for every i (repeats add up)."""
    counts.index_put_((rows, tokens), torch.ones(rows.shape, device=counts.device), accumulate=True)
