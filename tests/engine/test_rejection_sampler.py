"""Rejection sampling keeps the target distribution exactly (chi-square), and greedy keeps the argmax."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.rejection_sampler import verify
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata
from verifier_service.engine.sampling_params import SamplingParams

# Target logits of the three positions a request with two drafts scores: draft 0, draft 1, bonus.
ROWS = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0],
                     [0.0, 0.3, 2.0, 1.0, -0.5, 1.2],
                     [1.0, 1.0, 1.0, 0.2, 0.1, 0.0]])
VOCAB = ROWS.shape[1]


def reference_distribution(logits: list[float], params: SamplingParams) -> np.ndarray:
    """Temperature, then top-k, then top-p on what top-k kept, then min-p: written out plainly."""
    scaled = [x / params.temperature for x in logits]
    order = sorted(range(VOCAB), key=lambda i: -scaled[i])
    kept = order[:params.top_k] if params.top_k else order
    weights = {i: math.exp(scaled[i]) for i in kept}
    total, mass, nucleus = sum(weights.values()), 0.0, []
    for i in kept:
        if mass >= params.top_p:
            break
        nucleus.append(i)
        mass += weights[i] / total
    total = sum(weights[i] for i in nucleus)
    probs = np.zeros(VOCAB)
    for i in nucleus:
        probs[i] = weights[i] / total
    probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def run_batch(params: SamplingParams, drafts: list[int], num_requests: int, seed: int = 0):
    """num_requests identical requests with the same drafts and target rows, verified in one batch."""
    torch.manual_seed(seed)
    requests = [Request(f"r{i}", [0], params, i) for i in range(num_requests)]
    batch = ScheduledBatch([ScheduledRequest(r.request_id, [0] + drafts, 1, [0], len(drafts), len(drafts) + 1)
                            for r in requests])
    logits = ROWS[:len(drafts) + 1].repeat(num_requests, 1)  # [num_requests * (drafts + 1), vocab]
    return verify(logits, SamplingMetadata.build(batch, requests, torch.device("cpu")))


def assert_distributed_as(samples: list[int], expected: np.ndarray) -> None:
    counts = np.bincount(samples, minlength=VOCAB)
    support = expected > 0
    assert counts[~support].sum() == 0, f"sampled outside the support: {counts}"
    result = chisquare(counts[support], expected[support] * len(samples))
    assert result.pvalue > 1e-4, (counts, expected * len(samples))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.3),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.9, min_p=0.1),
], ids=["plain", "top_k", "top_p", "min_p", "all"])
@pytest.mark.parametrize("drafts", [[0, 2], [1, 5]], ids=["likely", "unlikely"])
def test_sampling_with_drafts_yields_the_target_distribution(params, drafts):
    verified = run_batch(params, drafts, num_requests=20_000)
    targets = [reference_distribution(row.tolist(), params) for row in ROWS]
    tokens = verified.token_ids
    assert_distributed_as([t[0] for t in tokens], targets[0])
    after_first = [t[1] for t in tokens if len(t) > 1]  # the first draft was accepted
    if len(after_first) > 500:
        assert_distributed_as(after_first, targets[1])
    bonus = [t[2] for t in tokens if len(t) > 2]  # both accepted: the bonus token
    if len(bonus) > 500:
        assert_distributed_as(bonus, targets[2])
    for t, accepted in zip(tokens, verified.num_accepted):
        assert t[:accepted] == drafts[:accepted] and len(t) == accepted + 1


def test_greedy_accepts_while_the_draft_is_the_argmax():
    params = SamplingParams(temperature=0.0)
    assert run_batch(params, [0, 2], 1).token_ids == [[0, 2, 0]]  # all accepted, bonus = argmax of row 2
    assert run_batch(params, [0, 3], 1).token_ids == [[0, 2]]  # second rejected, replaced by its argmax
    assert run_batch(params, [4, 2], 1).token_ids == [[0]]
    assert run_batch(params, [4, 2], 1).num_accepted == [0]


def test_same_seed_same_tokens_whatever_the_global_random_state():
    params = SamplingParams(temperature=1.0, seed=1234)
    first = run_batch(params, [1, 5], 50, seed=0).token_ids
    again = run_batch(params, [1, 5], 50, seed=99).token_ids
    assert first == again
    assert len({tuple(t) for t in first}) == 1  # every request has the same seed, so the same draws
