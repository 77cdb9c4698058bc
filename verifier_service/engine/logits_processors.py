"""Penalties and logit bias: the target model's logits adjusted before verification judges or samples them.

Per request (OpenAI's definitions for the first three, Hugging Face's for repetition_penalty), applied in
vLLM's order, before temperature / top-k / top-p / min-p (sampling.py) and before the greedy argmax:
1. logit_bias: logits[v] += bias[v] for each token id v given (bias in [-100, 100]).
2. repetition_penalty r > 0 over the prompt and the output so far: a seen token's logit is divided by r
   where it is positive and multiplied by r where it is not (r > 1 discourages repeats).
3. frequency_penalty f in [-2, 2]: logits[v] -= f * count[v], count over the output so far.
4. presence_penalty p in [-2, 2]: logits[v] -= p where count[v] > 0.

"So far" means before the row's position: in a verify step, row j of a request with drafts also counts
drafts 0..j - 1 (logits_processor_inputs.py), so every row is the distribution plain decoding would
have there, and greedy and sampled verification stay lossless: the output with speculation equals the
output without it. Rows of requests that use none of this are left as they are, and a batch in which
nobody uses any gets its logits back untouched, with no work done (inputs None). Penalties touch only the
tokens a request's context holds, so beyond one copy of the logits their cost follows the context, not the
vocabulary.
"""
from __future__ import annotations

import torch

from verifier_service.engine.logits_processor_inputs import LogitsProcessorInputs


def apply_logits_processors(
    logits: torch.Tensor,  # [num_rows, vocab]: every logits row of the step (bf16 on CUDA)
    inputs: LogitsProcessorInputs | None,
) -> torch.Tensor:  # [num_rows, vocab]: a new float32 tensor where some row is adjusted, else logits itself
    """The step's logits with every request's logit bias and penalties applied to its rows (in float32)."""
    if inputs is None:
        return logits
    # A copy: logits stays as the model made it (it may be a CUDA graph's output buffer).
    adjusted = logits.to(torch.float32, copy=True)
    if inputs.bias is not None:
        rows, tokens, values = inputs.bias
        adjusted.index_put_((rows, tokens), values, accumulate=True)
    if inputs.penalized:
        apply_penalties(adjusted, inputs)
    return adjusted


def apply_penalties(logits: torch.Tensor, inputs: LogitsProcessorInputs) -> None:  # logits [num_rows, vocab]
    """Repetition, then frequency, then presence penalty (vLLM's apply_penalties), in place. Only the tokens a
    penalty can change (each row's candidates: prompt, output, drafts) are read and written, not the vocabulary;
    a candidate listed twice gets the same value twice."""
    vocab_size = logits.shape[-1]
    candidates = inputs.row_candidates()  # [num_adjusted, width] token ids
    rows = inputs.rows.unsqueeze(1).expand_as(candidates)
    requests = inputs.row_request.unsqueeze(1).expand_as(candidates)
    # The output's counts, then the drafts before the row (row j of a request: its drafts 0..j - 1).
    drafts_before = (candidates.unsqueeze(2) == inputs.draft_before.unsqueeze(1)).sum(dim=2)  # [num_adjusted, width]
    counts = inputs.output_counts(vocab_size)[requests, candidates] + drafts_before  # [num_adjusted, width] float32
    values = logits[rows, candidates]  # [num_adjusted, width]
    if inputs.repetition is not None:
        seen = (counts > 0) | inputs.prompt_mask(vocab_size)[requests, candidates]
        penalty = torch.where(seen, inputs.repetition.unsqueeze(1), 1.0)
        values = torch.where(values > 0, values / penalty, values * penalty)
    if inputs.presence is not None:
        values = values - inputs.frequency.unsqueeze(1) * counts
        values = values - inputs.presence.unsqueeze(1) * (counts > 0)
    logits[rows, candidates] = values
