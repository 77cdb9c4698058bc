"""Rejection sampling keeps the target distribution exactly (chi-square), and emits the tokens decoding
without drafts would (each position's keyed sample); greedy keeps the argmax."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specd.sampling import SamplingParams
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.rejection_sampler import verify
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata

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


def run_batch(params: SamplingParams, drafts: list[int], seeds, first_position: int = 0):
    """One request per seed, with the same drafts and target rows, verified in one batch; its first row picks
    output position first_position (its prompt is one token, the drafts follow its last output)."""
    requests = [Request(f"r{i}", [0], dataclasses.replace(params, seed=seed), i) for i, seed in enumerate(seeds)]
    batch = ScheduledBatch([ScheduledRequest(r.request_id, [0] + drafts, first_position, [0], len(drafts),
                                             len(drafts) + 1) for r in requests])
    logits = ROWS[:len(drafts) + 1].repeat(len(requests), 1)  # [num_requests * (drafts + 1), vocab]
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
    verified = run_batch(params, drafts, seeds=range(20_000))
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
    assert run_batch(params, [0, 2], [None]).token_ids == [[0, 2, 0]]  # all accepted, bonus = argmax of row 2
    assert run_batch(params, [0, 3], [None]).token_ids == [[0, 2]]  # second rejected, replaced by its argmax
    assert run_batch(params, [4, 2], [None]).token_ids == [[0]]
    assert run_batch(params, [4, 2], [None]).num_accepted == [0]


def test_same_seed_same_tokens_whatever_the_global_random_state():
    params = SamplingParams(temperature=1.0)
    torch.manual_seed(0)
    first = run_batch(params, [1, 5], [1234] * 50).token_ids
    torch.manual_seed(99)
    again = run_batch(params, [1, 5], [1234] * 50).token_ids
    assert first == again
    assert len({tuple(t) for t in first}) == 1  # every request has the same seed, so the same noise
    assert len({tuple(t) for t in run_batch(params, [1, 5], range(50)).token_ids}) > 1


def sample_one_position(params: SamplingParams, seeds, row: torch.Tensor, positions) -> list[int]:
    """Decoding without drafts: per request (one per seed), the token picked from row [vocab] at its position."""
    requests = [Request(f"r{i}", [0], dataclasses.replace(params, seed=seed), i) for i, seed in enumerate(seeds)]
    batch = ScheduledBatch([ScheduledRequest(r.request_id, [0], position, [0], 0, 1)
                            for r, position in zip(requests, positions)])
    verified = verify(row.repeat(len(requests), 1), SamplingMetadata.build(batch, requests, torch.device("cpu")))
    return [tokens[0] for tokens in verified.token_ids]


def test_one_seed_samples_the_target_distribution_over_output_positions():
    """The noise of consecutive positions is independent: one seed's tokens over 20,000 positions are draws
    from the target too."""
    params = SamplingParams(temperature=1.0)
    samples = sample_one_position(params, [7] * 20_000, ROWS[0], range(20_000))
    assert_distributed_as(samples, reference_distribution(ROWS[0].tolist(), params))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
                                    SamplingParams(temperature=1.3, top_p=0.8)], ids=["plain", "top_k", "top_p"])
@pytest.mark.parametrize("drafts", [[0, 2], [1, 5], [2, 2], [0, 0]])
def test_drafts_are_accepted_exactly_when_they_equal_what_decoding_without_them_emits(params, drafts):
    """Each row's token is its position's keyed sample: verifying drafts emits the tokens that decoding one
    position at a time (no drafts, the same target rows) emits, for every seed."""
    seeds, position = range(500), 40
    plain = [sample_one_position(params, seeds, ROWS[j], [position + j] * len(seeds)) for j in range(len(ROWS))]
    speculated = run_batch(params, drafts, seeds, first_position=position)
    for i, (emitted, accepted) in enumerate(zip(speculated.token_ids, speculated.num_accepted)):
        expected = []
        for j in range(len(drafts) + 1):
            expected.append(plain[j][i])
            if j == len(drafts) or expected[-1] != drafts[j]:
                break  # the first draft that differs is replaced by the plain token; a bonus token ends it
        assert emitted == expected and accepted == len(expected) - 1


def test_a_rows_token_does_not_depend_on_the_filters_of_the_other_rows_of_its_step():
    """Unfiltered sampled rows go straight to the keyed race; a step in which some row filters (top-k, top-p,
    min-p) masks the logits first. Either way a row's token is the same, for every seed; and a greedy row takes
    the plain argmax, whatever filters its request also set."""
    plain, filtering = SamplingParams(temperature=0.9), SamplingParams(temperature=0.7, top_k=2, top_p=0.9, min_p=0.1)
    greedy_with_filters = SamplingParams(temperature=0.0, top_k=1, top_p=0.5)
    logits = ROWS[2:3] + torch.tensor([[0.0, 0.0, 1e-6, 0.0, 0.0, 0.0]])  # tokens 0-2 nearly tied: argmax is 2
    for seed in range(200):
        requests = {name: Request(name, [0], dataclasses.replace(params, seed=seed), i)
                    for i, (name, params) in enumerate([("plain", plain), ("filtering", filtering),
                                                        ("greedy", greedy_with_filters)])}

        def tokens(names: list[str]) -> list[int]:
            batch = ScheduledBatch([ScheduledRequest(name, [0], 7, [0], 0, 1) for name in names])
            metadata = SamplingMetadata.build(batch, [requests[n] for n in names], torch.device("cpu"))
            return [t[0] for t in verify(logits.repeat(len(names), 1), metadata).token_ids]

        alone = tokens(["plain"])[0]
        assert tokens(["plain", "filtering"])[0] == alone
        assert tokens(["filtering", "plain", "greedy"])[1:] == [alone, 2]
