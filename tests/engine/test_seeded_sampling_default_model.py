"""With the real default model (float32, CPU): a seeded sampled request emits the same tokens alone without
drafts as batched with n-gram drafts at k = 4 and 8, with async scheduling, from the prefix cache, and after
preemption. (The fake runner's tests, test_seeded_sampling.py, cover every variant; here the logits are a
real model's, computed in batches of other shapes.)"""
import dataclasses

import pytest

from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from support.proposers import BruteForceNgramProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner

TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog.",
    "List the numbers from one to twenty, separated by commas: one, two, three,",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
SEEDS = (0, 1)
SAMPLED = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16, kv_cache_bytes=64 * 2**20,
                      enable_prefix_caching=False, num_speculative_tokens=0, async_scheduling=False)
KV_BLOCK_BYTES = 737_280  # one 16-token block of the default model in float32


@pytest.fixture(scope="module")
def requests() -> dict[str, tuple[list[int], SamplingParams]]:
    return {f"p{p}s{seed}": (prompt, dataclasses.replace(SAMPLED, seed=seed))
            for p, prompt in enumerate(reference.default_model_token_ids(TEXTS)) for seed in SEEDS}


@pytest.fixture(scope="module")
def runner():
    return build_model_runner(CONFIG)


def generate(engine: Engine, requests) -> dict[str, list[int]]:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    return run(engine)


@pytest.fixture(scope="module")
def alone(requests, runner) -> dict[str, list[int]]:
    """Each request by itself, one token per step."""
    outputs = {rid: generate(Engine(CONFIG, runner=runner), {rid: request})[rid] for rid, request in requests.items()}
    assert len({tuple(out) for out in outputs.values()}) == len(outputs)  # sampled: every seed its own text
    return outputs


@pytest.mark.parametrize("k, async_scheduling", [(4, False), (8, True)])
def test_batched_with_drafts_the_same_tokens(requests, runner, alone, k, async_scheduling):
    config = dataclasses.replace(CONFIG, num_speculative_tokens=k, async_scheduling=async_scheduling)
    engine = Engine(config, proposer=BruteForceNgramProposer(), runner=runner)
    assert generate(engine, requests) == alone
    stats = engine.take_step_stats()
    assert sum(s.spec_decoding.num_accepted_tokens for s in stats if s.spec_decoding) > 0
    assert any(s.scheduled_ahead for s in stats) == async_scheduling


def test_from_the_prefix_cache_the_same_tokens(requests, runner, alone):
    engine = Engine(dataclasses.replace(CONFIG, enable_prefix_caching=True, num_speculative_tokens=4),
                    proposer=BruteForceNgramProposer(), runner=runner)
    generate(engine, requests)
    fed_first = sum(step.num_tokens for step in engine.take_step_stats())
    assert generate(engine, requests) == alone
    cached = sum((len(prompt) - 1) // 16 * 16 for prompt, _ in requests.values())  # full blocks of each prompt
    assert cached > 0 and sum(step.num_tokens for step in engine.take_step_stats()) <= fed_first - cached


def test_after_preemption_the_same_tokens(requests, alone):
    config = dataclasses.replace(CONFIG, kv_cache_bytes=10 * KV_BLOCK_BYTES, num_speculative_tokens=4)
    engine = Engine(config, proposer=BruteForceNgramProposer())
    assert engine.runner.num_blocks == 10
    assert generate(engine, requests) == alone
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0
