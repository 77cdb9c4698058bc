"""Weight loading: every parameter must come from the checkpoint, and every checkpoint tensor must fit."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_model.checkpoints import save_tiny_checkpoint
from verifier_service.model.loader import load_model


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
