"""Logprobs on CUDA (bf16, CUDA graphs, steps launched ahead): with drafts they equal decoding without, up to bf16
rounding of differently shaped batches, and each is the log-softmax of the model's own logits at its position."""
from __future__ import annotations

import pytest
import torch

from gpu.test_graphs_and_engine import BLOCK, MAX_TOKENS, PROMPTS, checkpoint, engine_for  # noqa: F401 - fixture
from support.engine_runs import top2_gap
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest

pytestmark = pytest.mark.gpu
TOLERANCE = 0.05  # log-probability difference bf16 logits (|x| < 1 here) of differently shaped batches may give
NEAR_TIE = 0.1  # top-2 logit gap under which such a batch may pick the other token (test_graphs_and_engine.py)


def generate_with_logprobs(engine, prompts: dict[str, list[int]], params):
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            logprobs.setdefault(output.request_id, []).extend(output.logprobs or [])
    return tokens, logprobs


def log_softmax_after(runner, context: list[int]) -> torch.Tensor:  # [vocab] float32
    table = list(range(-(-len(context) // BLOCK)))
    logits = runner.execute(ScheduledBatch([ScheduledRequest("reference", context, 0, table, 0, 1)]))[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "chained"])
def test_logprobs_with_drafts_and_graphs_equal_decoding_without_and_the_models_log_softmax(checkpoint,
                                                                                             async_scheduling):
    from support.proposers import OracleProposer
    from specd.sampling import SamplingParams

    prompts = {f"r{i}": p for i, p in enumerate([PROMPTS[0], PROMPTS[1], PROMPTS[2][:50]])}
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    plain_tokens, plain_logprobs = generate_with_logprobs(engine_for(checkpoint, None, async_scheduling=False),
                                                          prompts, params)
    proposer = OracleProposer({rid: prompts[rid] + out for rid, out in plain_tokens.items()})
    engine = engine_for(checkpoint, proposer, async_scheduling=async_scheduling)
    tokens, logprobs = generate_with_logprobs(engine, prompts, params)
    stats = engine.take_step_stats()
    assert sum(s.spec_decoding.num_accepted_tokens for s in stats if s.spec_decoding) > MAX_TOKENS
    worst, compared = 0.0, 0
    for rid, expected in plain_tokens.items():
        assert len(logprobs[rid]) == len(tokens[rid]) and len(plain_logprobs[rid]) == len(expected)
        assert [entry.token_id for entry in logprobs[rid]] == tokens[rid]
        same = next((i for i, (a, b) in enumerate(zip(tokens[rid], expected)) if a != b), len(expected))
        if same < len(expected):  # bf16: a differently shaped batch may flip a near-tie, nothing else
            gap = top2_gap(engine.runner, prompts[rid] + expected[:same], BLOCK)
            print(f"{rid}: first difference at token {same}, top-2 logit gap {gap:.4f}")
            assert gap < NEAR_TIE, f"{rid} differs at token {same} with a top-2 gap of {gap:.3f}: not a near-tie"
        for position in range(same):
            got, want = logprobs[rid][position], plain_logprobs[rid][position]
            assert len(got.top) == len(want.top) == 5
            assert got.top[0][0] == got.token_id or abs(got.top[0][1] - got.logprob) < TOLERANCE  # greedy: top-1
            worst = max(worst, abs(got.logprob - want.logprob), abs(got.top[0][1] - want.top[0][1]))
            compared += 1
        for position in sorted({0, same // 2, same - 1} & set(range(same))):  # the model's log-softmax (a prefill each)
            reference = log_softmax_after(engine.runner, prompts[rid] + expected[:position])
            token = tokens[rid][position]
            worst = max(worst, abs(logprobs[rid][position].logprob - float(reference[token])))
    print(f"{compared} logprobs compared; largest difference {worst:.4f}")
    assert worst < TOLERANCE
