"""Tiny random Hugging Face checkpoints of each supported family, and paged-layout helpers for tests."""
from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from verifier_service.engine.batch import ScheduledRequest

_SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, rms_norm_eps=1e-5)

# Each entry exercises a switch of ModelConfig; `shard` saves in several safetensors files.
TINY_CHECKPOINTS = {
    "llama-gqa-llama3-rope-untied-sharded": (LlamaConfig, dict(
        num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), True),
    "llama-tied-bias-head_dim": (LlamaConfig, dict(
        num_key_value_heads=4, head_dim=8, tie_word_embeddings=True, attention_bias=True, mlp_bias=True), False),
    "mistral-gqa": (MistralConfig, dict(num_key_value_heads=1, tie_word_embeddings=False), False),
    "qwen2-bias-tied": (Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True), False),
    "qwen3-qk_norm-untied": (Qwen3Config, dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=False), True),
}


def save_tiny_checkpoint(name: str, folder, **config_changes) -> None:
    """A random model of family `name` saved with save_pretrained; weights drawn wide enough to matter."""
    config_class, overrides, shard = TINY_CHECKPOINTS[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_class(**{**_SMALL, **overrides, **config_changes}), dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.15)  # norms and biases too, so a weight loaded in the wrong place shows
    model.save_pretrained(folder, max_shard_size="40KB" if shard else "1GB")


def hf_logits(model_dir, token_ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits [len(token_ids), vocab] for one sequence."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]


def random_block_tables(num_blocks: int, lengths: list[int], block_size: int, seed: int) -> list[list[int]]:
    """Disjoint, shuffled block tables covering `lengths` tokens each (blocks are not in order)."""
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = []
    for length in lengths:
        count = -(-length // block_size)
        tables.append([free.pop() for _ in range(count)])
    return tables


def prefill_request(request_id: str, token_ids: list[int], block_table: list[int]) -> ScheduledRequest:
    """A whole prompt in one chunk, asking for logits at every position."""
    return ScheduledRequest(request_id, token_ids, 0, block_table, 0, len(token_ids))
