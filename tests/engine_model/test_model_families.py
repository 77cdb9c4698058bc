"""Our model's logits equal transformers' (float32) for every supported family and the default model."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine_model.checkpoints import prefill_request, random_block_tables
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.model.config import rope_parameters
from verifier_service.engine.loader import load_model

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
    model = load_model(tiny_llama, "cpu", torch.float32)
    assert model.lm_head.weight is not model.model.embed_tokens.weight


def test_default_model_logits_match_transformers(default_model_dir, default_runner):
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    prompt = tokenizer("The paged KV cache stores keys and values in fixed-size blocks, so that")["input_ids"]
    runner = default_runner
    assert runner.config.tie_word_embeddings  # SmolLM2: the LM head is the embedding matrix
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], 16, seed=3)
    logits = runner.execute(ScheduledBatch([prefill_request("r", prompt, table)]))
    torch.testing.assert_close(logits, hf_logits(hf_model(default_model_dir), prompt), **TOLERANCE)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_close_to_float32(tiny_llama, dtype):
    prompt = list(range(3, 40))
    logits = {}
    for name in ("float32", dtype):
        runner = ModelRunner(tiny_llama, dtype=name, block_size=4, kv_cache_bytes=1 << 20)
        assert runner.model.model.embed_tokens.weight.dtype == getattr(torch, name)
        logits[name] = runner.execute(ScheduledBatch([prefill_request("r", prompt, list(range(10)))]))
    assert logits[dtype].dtype == getattr(torch, dtype)  # in the model's dtype: what reads them upcasts
    torch.testing.assert_close(logits[dtype].float(), logits["float32"], atol=0.1, rtol=0.05)


def test_rope_settings_read_from_transformers_4_and_5_configs():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    v4 = SimpleNamespace(rope_scaling={"rope_type": "llama3", **scaling}, rope_theta=500000.0)
    v4_old_key = SimpleNamespace(rope_scaling={"type": "llama3", **scaling}, rope_theta=500000.0)
    v5 = SimpleNamespace(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **scaling})
    expected = {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}
    assert rope_parameters(v4) == rope_parameters(v4_old_key) == rope_parameters(v5) == expected
    assert rope_parameters(SimpleNamespace(rope_theta=1e4)) == {"rope_type": "default", "rope_theta": 1e4}


def test_unsupported_architecture_is_rejected_by_name(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type"):
        ModelRunner(tmp_path, kv_cache_bytes=1 << 20)
