"""Decoding greedily with ModelRunner (prefill, then one token per step) reproduces transformers' generate."""
from __future__ import annotations

from engine_model.checkpoints import random_block_tables
from support.reference import cache_dir, hf_greedy
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner


def runner_greedy(runner: ModelRunner, prompt: list[int], max_new_tokens: int) -> list[int]:
    [table] = random_block_tables(runner.num_blocks, [len(prompt) + max_new_tokens], runner.block_size, seed=0)
    logits = runner.execute(ScheduledBatch([ScheduledRequest("r", prompt, 0, table, 0, 1)]))
    generated = [int(logits[-1].argmax())]
    while len(generated) < max_new_tokens:
        step = ScheduledRequest("r", generated[-1:], len(prompt) + len(generated) - 1, table, 0, 1)
        generated.append(int(runner.execute(ScheduledBatch([step]))[-1].argmax()))
    return generated


def test_tiny_model_greedy_equals_transformers(tiny_llama):
    runner = ModelRunner(tiny_llama, dtype="float32", block_size=4, kv_cache_bytes=1 << 20)
    prompts = [[3, 1, 4, 1, 5], list(range(40, 73))]
    expected = hf_greedy(tiny_llama, prompts, 20, ignore_eos=True)
    assert [runner_greedy(runner, p, 20) for p in prompts] == expected


def test_reference_results_are_cached_on_disk(tiny_llama):
    before = set(cache_dir().glob("*.json"))
    first = hf_greedy(tiny_llama, [[7, 8, 9]], 6, ignore_eos=True)
    written = set(cache_dir().glob("*.json")) - before
    assert hf_greedy(tiny_llama, [[7, 8, 9]], 6, ignore_eos=True) == first and len(first[0]) == 6
    assert len(written) <= 1  # 1 on a cold cache, 0 when an earlier run stored it


def test_default_model_greedy_equals_transformers(default_model_dir, default_runner):
    from transformers import AutoTokenizer

    model_dir = default_model_dir
    prompt = AutoTokenizer.from_pretrained(model_dir)("def fibonacci(n):")["input_ids"]
    [expected] = hf_greedy(model_dir, [prompt], 16, ignore_eos=True)
    assert runner_greedy(default_runner, prompt, 16) == expected


def test_prompt_tokens_equal_to_the_pad_id_are_not_masked(default_model_dir, default_runner):
    """The default model's pad id is its EOS (2); a prompt containing it must still be attended to."""
    prompt = [1, 2, 3, 4, 5]
    [expected] = hf_greedy(default_model_dir, [prompt], 4, ignore_eos=True)
    assert runner_greedy(default_runner, prompt, 4) == expected
