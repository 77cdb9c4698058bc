"""The deterministic mode with the real default model in bfloat16 on the CPU: greedy and seeded text identical,
with no tolerance, with speculation off and at k = 2 / 4 / 8, alone and batched with the others, after
preemption, and run after run. (Without the mode, bfloat16 text differs here in 2 of 6 prompts: the kernels'
summation order follows the step's shapes and flips near-ties.)"""
import dataclasses
from functools import partial

import pytest
import torch

from bench.instruction_prompts import instruction_prompts
from drafter_service.local import LocalProposer
from specd.sampling import SamplingParams
from support.engine_runs import argmax_agreement, generate_each
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.model_runner import _check_deterministic
from verifier_service.model.cpu_linear import onednn_linear_enabled
from verifier_service.runners import build_model_runner

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.bfloat16, upcast=True),
                                 reason="no oneDNN linears here (the mode refuses to start)")]

NUM_PROMPTS, MAX_TOKENS = 6, 32
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, seed=11)
CONFIG = EngineConfig(model="default", device="cpu", dtype="bfloat16", kv_cache_bytes=64 * 2**20,
                      num_speculative_tokens=0, async_scheduling=False, deterministic=True)
KV_BLOCK_BYTES = 368_640  # one 16-token block of the default model in bfloat16


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    from specd.default_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False) for text in instruction_prompts(NUM_PROMPTS, max_chars=600)]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@pytest.fixture(scope="module")
def runner():
    return build_model_runner(CONFIG)


generate = partial(generate_each, CONFIG)  # (runner, prompts, params, k, together, engine)


@pytest.fixture(scope="module")
def alone(runner, prompts) -> list[list[int]]:
    """Greedy, each prompt by itself, one token per step: plain decoding."""
    return generate(runner, prompts, GREEDY, together=False)


@pytest.mark.parametrize("k, together", [(0, True), (4, False), (2, True), (8, True)])
def test_greedy_text_is_the_same_with_drafts_and_in_a_batch(runner, prompts, alone, k, together):
    assert generate(runner, prompts, GREEDY, k, together) == alone


def test_greedy_text_is_the_same_after_preemption(runner, prompts, alone):
    """A KV cache too small for all at once: requests are preempted and recomputed, in other chunks."""
    small = dataclasses.replace(CONFIG, kv_cache_bytes=40 * KV_BLOCK_BYTES, num_speculative_tokens=4)
    engine = Engine(small, proposer=LocalProposer())
    assert engine.runner.num_blocks == 40
    assert generate(None, prompts, GREEDY, engine=engine) == alone
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0


def test_seeded_sampling_is_the_same_with_drafts_and_in_a_batch(runner, prompts):
    assert generate(runner, prompts, SEEDED, 4, together=True) == generate(runner, prompts, SEEDED, together=False)


def test_the_mode_scores_as_the_model_does(runner, prompts):
    """Identical text alone proves nothing if the mode computes something else: its argmax is float32 transformers'
    over a prompt, but for bfloat16 near-ties."""
    from specd.default_model import resolve_model_path

    assert argmax_agreement(runner, resolve_model_path("default"), prompts[0], CONFIG.block_size) >= 0.9


def test_a_second_run_gives_the_same_text(prompts, alone):
    assert generate(build_model_runner(CONFIG), prompts, GREEDY, 4) == alone


def test_the_mode_refuses_where_its_kernels_are_not_built():
    with pytest.raises(ValueError, match="^deterministic: on CUDA needs bfloat16 or float16"):
        _check_deterministic(torch.device("cuda"), torch.float32, None)
    with pytest.raises(ValueError, match="head_dim 96"):
        _check_deterministic(torch.device("cuda"), torch.bfloat16, None, head_dim=96)
    with pytest.raises(ValueError, match="block_size 16"):
        _check_deterministic(torch.device("cuda"), torch.bfloat16, None, block_size=16)
    with pytest.raises(ValueError, match="tensor parallelism on CUDA"):
        _check_deterministic(torch.device("cuda"), torch.bfloat16, object())  # a rank's shard
