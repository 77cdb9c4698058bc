"""The target distribution: logits -> scores (log-probabilities up to a per-row constant) with temperature,
top-k, top-p and min-p; and the same filters as a mask on the logits, for the keyed race (which divides by the
temperature itself, keyed_noise.py).

Filters apply in vLLM's order: temperature, then top-k, then top-p on what top-k kept, then min-p
(relative to the most likely token). Every argument is per row so one call serves a mixed batch. The keyed
sampler races logits / T with the filtered tokens at -inf (keyed_noise.py), so a sampled step runs no softmax;
processed logprobs are the scores' log_softmax (logprobs.py).
"""
from __future__ import annotations

import math

import torch


def target_scores(
    logits: torch.Tensor,  # [num_rows, vocab] float32
    temperature: torch.Tensor,  # [num_rows] > 0 (greedy rows pass 1.0; their argmax is used instead)
    top_k: torch.Tensor,  # [num_rows] int, 0 = off
    top_p: torch.Tensor,  # [num_rows] in (0, 1], 1 = off
    min_p: torch.Tensor,  # [num_rows] in [0, 1], 0 = off
    filters: tuple[bool, bool, bool] | None = None,
) -> torch.Tensor:  # [num_rows, vocab]: logits / temperature, -inf where a filter removes the token
    """Each row's filtered, temperature-scaled distribution as scores: its log-probabilities plus a per-row
    constant (softmax(scores) is the distribution; argmax and the keyed race need no normalising).

    filters: whether any row uses top-k, top-p, min-p, when the caller knows it on the host (on CUDA,
    asking the tensors costs a host sync each); None = ask the tensors.
    """
    scores = logits / temperature.unsqueeze(1)
    if filters is None:
        filters = bool((top_k > 0).any()), bool((top_p < 1.0).any()), bool((min_p > 0.0).any())
    use_top_k, use_top_p, use_min_p = filters
    if use_top_k or use_top_p:
        scores = _apply_top_k_top_p(scores, top_k, top_p, use_top_p)
    if use_min_p:  # p < min_p * max p, in logs: score < max score + log(min_p) (min_p 0: log 0 = -inf, none)
        threshold = scores.max(dim=-1, keepdim=True).values + min_p.log().unsqueeze(1)
        scores = scores.masked_fill(scores < threshold, -math.inf)
    return scores


def filter_logits(
    logits: torch.Tensor,  # [num_rows, vocab], any float dtype
    temperature: torch.Tensor,  # [num_rows] > 0
    top_k: torch.Tensor,  # [num_rows] int, 0 = off
    top_p: torch.Tensor,  # [num_rows] in (0, 1], 1 = off
    min_p: torch.Tensor,  # [num_rows] in [0, 1], 0 = off
    filters: tuple[bool, bool, bool],  # whether any row uses top-k, top-p, min-p (known on the host)
) -> torch.Tensor:  # [num_rows, vocab]: logits itself when no row filters, else float32 with -inf where removed
    """The logits, unscaled, with -inf where target_scores' filters remove a token: what the keyed race takes.
    It divides by the temperature in its own kernel, so every sampled row's score is that one division, whether
    or not another row of the step filters."""
    if not any(filters):
        return logits
    logits = logits.float()  # one float32 copy of bf16 logits (none of float32 ones): masked_fill makes the new tensor
    removed = target_scores(logits, temperature, top_k, top_p, min_p, filters) == -math.inf
    return logits.masked_fill(removed, -math.inf)


def _apply_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, vocab]
    top_k: torch.Tensor,  # [num_rows]
    top_p: torch.Tensor,  # [num_rows]
    use_top_p: bool,
) -> torch.Tensor:  # [num_rows, vocab] with filtered-out entries at -inf
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    outside_top_k = (top_k.unsqueeze(1) > 0) & (ranks >= top_k.unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(outside_top_k, float("-inf"))
    if use_top_p:
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p: a token goes once the tokens before it
        # already hold top_p (the most likely token always stays).
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
