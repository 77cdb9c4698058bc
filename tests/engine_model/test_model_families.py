"""Our model's logits equal transformers' (float32) for every supported family and the default model."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine_model.checkpoints import prefill_request, random_block_tables
from specd.default_model import resolve_model_path
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.model_runner import ModelRunner

TOLERANCE = dict(atol=1e-4, rtol=1e-4)


def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits [len(token_ids), vocab] for one sequence on its own."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]


def test_tiny_checkpoint_logits_match_transformers(tiny_checkpoint):
    """Three prompts of different lengths prefilled together in one step, on shuffled blocks."""
    runner = ModelRunner(tiny_checkpoint, dtype="float32", block_size=4, kv_cache_bytes=1 << 20)
    reference = hf_model(tiny_checkpoint)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=generator).tolist() for n in (23, 7, 40)]
    tables = random_block_tables(runner.num_blocks, [len(p) for p in prompts], 4, seed=2)
    batch = ScheduledBatch([prefill_request(f"r{i}", p, t) for i, (p, t) in enumerate(zip(prompts, tables))])
    logits = runner.execute(batch)
    assert logits.dtype == torch.float32 and logits.shape == (sum(map(len, prompts)), runner.vocab_size)
    expected = torch.cat([hf_logits(reference, p) for p in prompts])
    torch.testing.assert_close(logits, expected, **TOLERANCE)


def test_sharded_checkpoint_is_really_sharded(tiny_llama):
    index = json.loads((tiny_llama / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


def test_untied_lm_head_is_its_own_matrix(tiny_llama):
    runner = ModelRunner(tiny_llama, dtype="float32", block_size=4, kv_cache_bytes=1 << 20)
    assert runner.model.lm_head.weight is not runner.model.model.embed_tokens.weight


@pytest.fixture(scope="module")
def default_model_dir():
    return resolve_model_path("default")


def test_default_model_logits_match_transformers(default_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    prompt = tokenizer("The paged KV cache stores keys and values in fixed-size blocks, so that")["input_ids"]
    runner = ModelRunner(default_model_dir, dtype="float32", block_size=16, kv_cache_bytes=64 << 20)
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight  # tied in SmolLM2
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], 16, seed=3)
    logits = runner.execute(ScheduledBatch([prefill_request("r", prompt, table)]))
    torch.testing.assert_close(logits, hf_logits(hf_model(default_model_dir), prompt), **TOLERANCE)
