"""The greedy verdict a CUDA-graph step computes inside the graph (greedy_verdict.py) is the rejection
sampler's greedy result for the same rows, padding included; and the drafts guessed for a step launched
behind one still in flight (draft_lookahead.py) follow the proposal past the guessed outcome."""
from __future__ import annotations

import random

import pytest
import torch

from specd.sampling import SamplingParams
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.draft_lookahead import continuations_after_known, drafts_after
from verifier_service.engine.greedy_verdict import decode_verdict, greedy_verdict, row_argmax
from verifier_service.engine.rejection_sampler import PendingVerification, verify
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata

VOCAB = 7


@pytest.mark.parametrize("seed", range(30))
def test_greedy_verdict_equals_the_rejection_samplers_greedy_result(seed):
    rng = random.Random(seed)
    width, num_requests = rng.choice([1, 2, 3, 5, 9]), rng.randint(1, 6)
    bucket = num_requests + rng.randint(0, 3)  # padding sequences after the real ones
    logits = torch.randn(bucket * width, VOCAB, generator=torch.Generator().manual_seed(seed))
    target = logits.argmax(-1).view(bucket, width)
    ids, counts, scheduled = torch.zeros(bucket, width, dtype=torch.int64), [], []
    for i in range(num_requests):
        count = rng.randint(1, width)
        # drafts that follow the argmax for a while, then (maybe) leave it: every acceptance length occurs
        drafts = [int(target[i, j]) if rng.random() < 0.7 else rng.randrange(VOCAB) for j in range(count - 1)]
        ids[i, :count] = torch.tensor([rng.randrange(VOCAB)] + drafts)
        counts.append(count)
        scheduled.append(ScheduledRequest(f"r{i}", ids[i, :count].tolist(), 10, [0], count - 1, count))
    counts += [0] * (bucket - num_requests)
    rows, continuation = greedy_verdict(logits, ids, torch.tensor(counts))

    requests = [Request(s.request_id, [0], SamplingParams(max_tokens=50), i) for i, s in enumerate(scheduled)]
    real_rows = [i * width + j for i, count in enumerate(counts) for j in range(count)]
    expected = verify(logits[real_rows], SamplingMetadata.build(ScheduledBatch(scheduled), requests, "cpu"))
    got = PendingVerification(rows[:num_requests], list(range(num_requests)), num_requests,
                              continuation[:num_requests]).result()
    assert got == expected
    assert continuation[:num_requests].tolist() == [[t[-1], a] for t, a in
                                                    zip(expected.token_ids, expected.num_accepted)]


@pytest.mark.parametrize("proposal, in_flight, slots, expected", [
    ([5, 6, 7, 8, 9, 10], [5, 6], 3, [8, 9, 10]),  # all in-flight drafts agree: guessed bonus 7, then 8..
    ([5, 6, 7, 8, 9, 10], [5, 4], 3, [7, 8, 9]),  # the second disagrees: guessed recovered token 6
    ([5, 6, 7], [], 4, [6, 7]),  # nothing in flight beyond one token: proposal[0] is its guess
    ([5], [5, 6], 2, []),  # the proposal ends before the guess does: no drafts
    ([], [1], 2, []),
])
def test_drafts_after_the_guessed_outcome_of_the_step_in_flight(proposal, in_flight, slots, expected):
    assert drafts_after(proposal, in_flight, slots) == expected


def test_a_proposal_asked_a_step_earlier_continues_after_the_tokens_known_since():
    """Asked on 3 tokens; 2 more became known (the last list entry is a placeholder, not known)."""
    tokens, known = [1, 2, 3, 4, 5, 0], 5
    assert continuations_after_known({"a": [4, 5, 6, 7]}, {"a": 3}, {"a": (tokens, known)}) == {"a": [6, 7]}
    assert continuations_after_known({"a": [4, 9, 6, 7]}, {"a": 3}, {"a": (tokens, known)}) == {}  # guessed wrong
    assert continuations_after_known({"a": [4, 5]}, {"a": 3}, {"a": (tokens, known)}) == {}  # nothing beyond
    assert continuations_after_known({"a": [4, 5, 6]}, {"a": 3}, {}) == {}  # the request is gone


@pytest.mark.parametrize("bucket", [1, 3, 8])
def test_the_decode_verdict_equals_the_greedy_verdict_at_width_1(bucket):
    logits = torch.randn(bucket, VOCAB, generator=torch.Generator().manual_seed(bucket))
    ids = torch.randint(0, VOCAB, (bucket, 1))
    counts = torch.tensor([1] * (bucket - 1) + [0])  # the last sequence is padding
    for got, expected in zip(decode_verdict(logits, ids, counts), greedy_verdict(logits, ids, counts)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("vocab", [151936, 49152, 1000, 7])
def test_row_argmax_equals_argmax_with_ties_infinities_and_nan(vocab):
    """The two-stage argmax gives torch.argmax's index: the first of tied maxima (rows of a few distinct values
    tie everywhere), rows of -inf alone, and the first NaN."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randint(0, 3, (6, vocab), generator=generator).float()
    logits[1] = float("-inf")
    logits[2, vocab // 2] = float("inf")
    logits[3, vocab - 1] = float("nan")
    logits[4, [vocab // 3, vocab - 2]] = float("nan")
    logits[5] = torch.randn(vocab, generator=generator)
    assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(row_argmax(logits.bfloat16()), logits.bfloat16().argmax(dim=-1))


def test_row_argmax_takes_the_gathered_logits_slice_of_a_padded_vocabulary():
    """Under tensor parallelism the logits are [rows, padded vocab][:, :vocab]: not contiguous."""
    padded = torch.randn(3, 1024, generator=torch.Generator().manual_seed(0))
    logits = padded[:, :1000]
    assert not logits.is_contiguous()
    assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
