"""KV cache sizing and layout."""
from __future__ import annotations

import pytest
import torch

from verifier_service.engine.kv_cache import KVCache, bytes_per_block, num_blocks_for_budget
from verifier_service.model.config import load_model_config


@pytest.fixture(scope="module")
def config(tiny_llama):
    return load_model_config(tiny_llama)  # 2 layers, 2 KV heads of 16


def test_bytes_per_block_counts_keys_and_values_of_every_layer(config):
    assert bytes_per_block(config, 16, torch.float32) == 2 * 2 * 16 * 2 * 16 * 4
    assert bytes_per_block(config, 16, torch.bfloat16) == bytes_per_block(config, 16, torch.float32) // 2


def test_budget_gives_whole_blocks_only(config):
    block = bytes_per_block(config, 4, torch.float32)
    assert num_blocks_for_budget(10 * block + block - 1, block) == 10
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        num_blocks_for_budget(block - 1, block)


def test_layers_get_separate_caches_in_flash_layout(config):
    cache = KVCache.allocate(config, num_blocks=5, block_size=4, dtype=torch.float32, device=torch.device("cpu"))
    assert len(cache.k_caches) == len(cache.v_caches) == config.num_layers
    assert cache.k_caches[0].shape == (5, 4, config.num_kv_heads, config.head_dim)
    cache.k_caches[1].fill_(1.0)
    assert cache.k_caches[0].abs().sum() == 0 and cache.v_caches[1].abs().sum() == 0
