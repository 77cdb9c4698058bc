"""Lossless verification of draft tokens (speculative sampling, Leviathan et al., arXiv 2211.17192).

Terms. For a request with d drafts the model scored d + 1 positions: row j (j < d) is the target
distribution p_j for the position of draft j, row d follows the last draft.
- draft: a token proposed by the drafter; scored, not yet emitted.
- accepted: a draft kept as output. Drafts are accepted left to right until the first rejection.
- recovered token: emitted in place of the first rejected draft, drawn from p_j with the draft removed.
- bonus token: emitted after all d drafts were accepted, drawn from row d.
So every verify step emits num_accepted + 1 tokens.

Greedy (temperature 0): accept while draft == argmax p_j; the recovered / bonus token is the argmax,
so the output equals plain greedy decoding token for token.

Sampling (temperature > 0): every position's token is the keyed sample of its target p_j (p filtered by
temperature, top-k, top-p, min-p): y_j = argmax_v p_j(v) / E(seed, position, v), with E Exp(1) noise that
depends only on the request's seed, the output position and the token (keyed_noise.py): the exponential
race, so y_j is a draw from p_j (run in logs on the scaled, filtered logits: no softmax). A draft is
accepted exactly when it equals y_j; the first row whose draft differs emits y_j (the recovered token, != the
draft), and after d accepted drafts the bonus row emits y_d.
n-gram drafts propose one token with certainty (the draft distribution q is a point mass on x), and this is
the paper's rule for that q: x is accepted with probability P(y = x) = p(x) = min(1, p(x) / q(x)), and a
rejection emits y given y != x, i.e. p with x removed and renormalised, the residual max(0, p - q)
normalised. So each emitted token is distributed exactly as p_j, and, more than that, it is the very token
decoding without speculation would emit at that position: seeded output does not depend on speculation,
k, the batch, preemption or prefix-cache hits. Every sampled request has a seed (a random one if the
client gave none, request.py). Greedy rows need no noise. p_j is the target of the logits after penalties and
logit bias (logits_processors.py), which are applied to every row first.

Everything runs on the whole batch with tensor ops; the result reaches the host in one copy, which
verify_async leaves queued so the engine can launch the next step before waiting for it. Requests that ask
for logprobs get them from the same logits (logprobs.py), copied right behind. Greedy decode /
verify steps replayed from a CUDA graph judge their drafts inside the graph instead (greedy_verdict.py),
with the same result layout.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from verifier_service.engine.keyed_noise import keyed_sample
from verifier_service.engine.logits_processors import apply_logits_processors
from verifier_service.engine.logprobs import DeviceLogprobs, emitted_logprobs, raw_logprobs
from verifier_service.engine.outputs import TokenLogprobs
from verifier_service.engine.sampling import filter_logits
from verifier_service.engine.sampling_metadata import SamplingMetadata


@dataclass(frozen=True)
class VerifiedTokens:
    """Per request of the scheduled batch (in its order); empty for requests that had no logits."""

    token_ids: list[list[int]]  # emitted: accepted drafts, then one recovered or bonus token
    num_accepted: list[int]  # drafts accepted
    # Per request, one entry per emitted token for those that asked for logprobs (None: nobody in the step did).
    logprobs: list[list[TokenLogprobs] | None] | None = None


class PendingVerification:
    """A verify result still on the device: its copy to the host is queued behind the step's kernels.

    rows [num_requests, width + 1]: per request with logits (in the order of batch_indices), its emitted
    tokens in the first num_accepted + 1 columns and num_accepted in the last. previous_result [num_requests,
    2] (device): (last token emitted, drafts accepted) per request, what the next step continues from when
    it is launched before the host has seen this one (the engine's async scheduling). logprobs: the emitted
    tokens' log-probabilities where a request asked (logprobs.py), copied right behind the rows.
    """

    def __init__(self, rows: torch.Tensor, batch_indices: list[int], batch_size: int,
                 previous_result: torch.Tensor | None = None, logprobs: DeviceLogprobs | None = None):
        self.batch_indices, self.batch_size = batch_indices, batch_size
        self.previous_result = previous_result if previous_result is not None else continuation(rows)
        self._logprobs = logprobs
        self._ready: torch.cuda.Event | None = None
        if rows.is_cuda:  # non-blocking into pinned memory; result() waits for this copy only
            self._host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            self._host.copy_(rows, non_blocking=True)
            if logprobs is not None:
                logprobs.copy_to_host()
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = rows

    def result(self) -> VerifiedTokens:
        """Waits for the step (the one device-to-host copy) and unpacks it per request."""
        if self._ready is not None:
            self._ready.synchronize()
        verified = _unpack(self._host.tolist(), self.batch_indices, self.batch_size)
        if self._logprobs is None:
            return verified
        return replace(verified, logprobs=self._logprobs.per_request(verified.token_ids, self.batch_indices))


def continuation(rows: torch.Tensor) -> torch.Tensor:
    """rows [n, width + 1] as PendingVerification holds them -> [n, 2] (last token emitted, drafts accepted)."""
    num_accepted = rows[:, -1:]
    return torch.cat([rows.gather(1, num_accepted), num_accepted], dim=1)


def verify(
    logits: torch.Tensor,  # [num_rows, vocab] any float dtype: rows of each request with logits, in batch order
    metadata: SamplingMetadata,
) -> VerifiedTokens:
    """Accept or reject every request's drafts and choose the token that follows them."""
    return verify_async(logits, metadata).result()


def verify_async(logits: torch.Tensor, metadata: SamplingMetadata) -> PendingVerification:
    """verify, with the result left on the device until PendingVerification.result() asks for it."""
    raw = raw_logprobs(logits, metadata.logprobs)  # before anything processes the logits (None: nobody asked)
    logits = apply_logits_processors(logits, metadata.logits_processors)  # penalties, logit bias (new tensor)
    accepted, replacement = _judge_rows(logits, metadata)  # [num_rows] bool, [num_rows] int64
    num_columns = metadata.row_index.shape[1]  # max drafts + 1
    accepted_padded = accepted[metadata.row_index[:, :-1]] & metadata.draft_mask  # [num_requests, max_drafts]
    num_accepted = accepted_padded.long().cumprod(dim=1).sum(dim=1)  # [num_requests]
    columns = torch.arange(num_columns, device=logits.device).unsqueeze(0)
    drafts = torch.nn.functional.pad(metadata.draft_token_ids, (0, 1))  # [num_requests, max_drafts + 1]
    output = torch.where(columns < num_accepted.unsqueeze(1), drafts, replacement[metadata.row_index])
    rows = torch.cat([output, num_accepted.unsqueeze(1)], dim=1)
    logprobs = emitted_logprobs(raw, logits, output, metadata.logprobs)
    return PendingVerification(rows, metadata.batch_indices, metadata.batch_size, logprobs=logprobs)


def _judge_rows(
    logits: torch.Tensor,  # [num_rows, vocab]
    metadata: SamplingMetadata,
) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [num_rows] bool, chosen token [num_rows] int64
    """Per row: the token plain decoding picks at its position (argmax, or the keyed sample), and whether
    the row's draft equals it (accepted); the token replaces the draft if not (or follows, on a bonus row)."""
    if metadata.all_greedy:
        chosen = logits.argmax(dim=-1)
    else:  # one pass over the logits: greedy rows take their argmax, sampled rows the exponential race
        filtered = filter_logits(logits, metadata.row_temperature, metadata.row_top_k, metadata.row_top_p,
                                 metadata.row_min_p, (metadata.use_top_k, metadata.use_top_p, metadata.use_min_p))
        chosen = keyed_sample(filtered, metadata.row_temperature, metadata.row_keys, metadata.row_greedy)
    return metadata.row_draft == chosen, chosen


def _unpack(host: list[list[int]], batch_indices: list[int], batch_size: int) -> VerifiedTokens:
    token_ids: list[list[int]] = [[] for _ in range(batch_size)]
    num_accepted = [0] * batch_size
    for row, batch_index in zip(host, batch_indices):
        count = row[-1]
        token_ids[batch_index] = row[:count + 1]
        num_accepted[batch_index] = count
    return VerifiedTokens(token_ids, num_accepted)
