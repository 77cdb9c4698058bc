"""The engine on two CPU ranks (gloo) with the real default model, float32: greedy output equals transformers'
generate token for token, without drafts, with n-gram drafts, and with async scheduling with and without drafts
(the step in flight's result, last token and accepted drafts, reaches rank 1 as device feedback beside the batch).

SmolLM2-135M has 9 query heads in 3 KV groups: rank 0 holds two groups, rank 1 one (sharding/shard.py).
"""
import dataclasses

import pytest

from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from support.proposers import BruteForceNgramProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner

MAX_TOKENS = 64
TEXTS = [  # four of tests/engine/test_engine_greedy.py's prompts: the transformers results are cached on disk
    "The capital of France is",
    "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog.",
    "List the numbers from one to twenty, separated by commas: one, two, three,",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3,
]
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16, kv_cache_bytes=64 * 2**20,
                      max_num_batched_tokens=512, num_speculative_tokens=4, tensor_parallel_size=2)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return reference.default_model_token_ids(TEXTS)


@pytest.fixture(scope="module")
def hf_greedy(prompts) -> dict[str, list[int]]:
    outputs = reference.hf_greedy(resolve_model_path("default"), prompts, MAX_TOKENS, ignore_eos=True)
    return {f"p{index}": output for index, output in enumerate(outputs)}


@pytest.fixture(scope="module")
def runner():
    """Rank 0's runner; rank 1 runs in its own process until the module is done."""
    runner = build_model_runner(CONFIG)
    yield runner
    runner.close()


def generate(engine: Engine, prompts: list[list[int]]) -> dict[str, list[int]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(f"p{index}", prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return run(engine)


def test_the_model_is_split_by_kv_group(runner):
    attention = runner.model.model.layers[0].self_attn
    assert runner.tensor_parallel_size == 2
    assert (attention.num_heads, attention.num_kv_heads) == (6, 2)  # rank 1 holds the other 3 and 1


@pytest.mark.parametrize("drafts", ["none", "ngram"])
def test_greedy_on_two_ranks_equals_transformers_generate(drafts, prompts, hf_greedy, runner):
    proposer = BruteForceNgramProposer() if drafts == "ngram" else None
    engine = Engine(CONFIG, proposer=proposer, runner=runner)
    assert generate(engine, prompts) == hf_greedy
    if proposer is not None:
        assert sum(s.spec_decoding.num_accepted_tokens for s in engine.take_step_stats() if s.spec_decoding) > 0


@pytest.mark.parametrize("drafts", ["none", "ngram"])
def test_async_scheduling_on_two_ranks_equals_transformers_generate(drafts, prompts, hf_greedy, runner):
    continuing, advancing = [], []

    class CountingRunner:  # rank 0's runner; counts the batches that continue from the step in flight
        def __getattr__(self, name):
            return getattr(runner, name)

        def execute(self, batch):
            continuing.append(batch.previous_result is not None)
            advancing.append(any(r.previous_num_drafts for r in batch.requests))
            return runner.execute(batch)

    proposer = BruteForceNgramProposer() if drafts == "ngram" else None
    engine = Engine(dataclasses.replace(CONFIG, async_scheduling=True), proposer=proposer, runner=CountingRunner())
    assert generate(engine, prompts) == hf_greedy
    assert sum(continuing) > MAX_TOKENS // 4
    assert any(advancing) is (proposer is not None)  # behind a step with drafts: positions depend on its result
