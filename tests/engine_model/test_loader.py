"""Weight loading: every parameter must come from the checkpoint, and every checkpoint tensor must fit."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_model.checkpoints import prefill_request, save_tiny_checkpoint
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.engine.loader import load_model


@pytest.fixture
def mistral_dir(tmp_path):
    save_tiny_checkpoint("mistral-gqa", tmp_path)  # one model.safetensors file
    return tmp_path


def rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_fused_projections_hold_the_checkpoint_rows_in_order(mistral_dir):
    tensors = load_file(mistral_dir / "model.safetensors")
    model = load_model(mistral_dir, "cpu", torch.float32)
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    expected_qkv = torch.cat([tensors[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    expected_gate_up = torch.cat([tensors[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(attention.qkv_proj.weight, expected_qkv)
    assert torch.equal(mlp.gate_up_proj.weight, expected_gate_up)


def test_missing_weight_is_named(mistral_dir):
    rewrite(mistral_dir, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match="qkv_proj"):
        load_model(mistral_dir, "cpu", torch.float32)


def test_unknown_weight_is_named(mistral_dir):
    rewrite(mistral_dir, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="model.layers.0.extra.weight"):
        load_model(mistral_dir, "cpu", torch.float32)


def test_checkpoint_without_lm_head_ties_it_to_the_embeddings(mistral_dir):
    rewrite(mistral_dir, lambda t: t.pop("lm_head.weight"))
    model = load_model(mistral_dir, "cpu", torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_random_weights_make_the_next_token_follow_from_the_current_one(tmp_path):
    """Random-weight models can take a plain greedy run's tokens as drafts (the retired TP bench's --speculation, 70B
    shapes have no checkpoint here). Their greedy choice after token t is t + 1 whatever came before, by a margin
    far above any rounding (at 70B shapes in bf16, near-flat logits let greedy with and without drafts part at
    token 11), so the drafts are accepted as a confident real model's would be."""
    save_tiny_checkpoint("qwen3-qk_norm-untied", tmp_path, num_hidden_layers=8)  # only its config.json is read
    runner = ModelRunner(tmp_path, dtype="float32", block_size=4, kv_cache_bytes=1 << 20, random_weights=True)
    generator = torch.Generator().manual_seed(0)
    for last in (5, 17, 99, runner.vocab_size - 1):
        for _ in range(4):  # four random contexts before it
            prompt = torch.randint(0, 128, (12,), generator=generator).tolist() + [last]
            logits = runner.execute(ScheduledBatch([prefill_request("r", prompt, list(range(4)))]))[-1]
            top2 = logits.topk(2)
            assert int(top2.indices[0]) == (last + 1) % runner.vocab_size
            assert top2.values[0] - top2.values[1] > 0.1 * top2.values[0]  # bf16 rounds by at most 0.4%
