"""With the real default model (float32, CPU): greedy decoding with repetition_penalty equals transformers'
generate(do_sample=False, repetition_penalty=...), without drafts and with n-gram or oracle drafts, with async
scheduling off and on."""
import dataclasses

import pytest

from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from support.proposers import BruteForceNgramProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

MAX_TOKENS = 32
PENALTY = 1.3
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "List the numbers from one to twenty, separated by commas: one, two, three,",
]
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16, kv_cache_bytes=32 * 2**20,
                      max_num_batched_tokens=512, num_speculative_tokens=4)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return reference.default_model_token_ids(TEXTS)


@pytest.fixture(scope="module")
def hf_penalized(prompts) -> dict[str, list[int]]:
    outputs = reference.hf_greedy(resolve_model_path("default"), prompts, MAX_TOKENS, ignore_eos=True,
                                  repetition_penalty=PENALTY)
    return {f"p{index}": output for index, output in enumerate(outputs)}


@pytest.fixture(scope="module")
def runner():
    from verifier_service.runners import build_model_runner

    return build_model_runner(CONFIG)


def test_the_penalty_changes_transformers_output(prompts, hf_penalized):
    plain = reference.hf_greedy(resolve_model_path("default"), prompts, MAX_TOKENS, ignore_eos=True)
    assert list(hf_penalized.values()) != plain  # else equality below would not show the penalty is applied


@pytest.mark.parametrize("kind, async_scheduling", [("none", False), ("ngram", False), ("oracle", False),
                                                    ("none", True), ("oracle", True)])
def test_greedy_with_repetition_penalty_equals_transformers(kind, async_scheduling, prompts, hf_penalized, runner):
    references = {rid: prompts[int(rid[1:])] + out + [0] * 8 for rid, out in hf_penalized.items()}
    proposer = {"none": None, "ngram": BruteForceNgramProposer(), "oracle": OracleProposer(references)}[kind]
    engine = Engine(dataclasses.replace(CONFIG, async_scheduling=async_scheduling), proposer=proposer, runner=runner)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, repetition_penalty=PENALTY)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"p{index}", prompt, params)
    assert run(engine) == hf_penalized
    spec = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    if kind == "oracle":
        assert sum(s.num_accepted_tokens for s in spec) == sum(s.num_draft_tokens for s in spec) > 0
