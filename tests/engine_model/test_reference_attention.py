"""The reference paged attention equals dense causal attention, whatever the block layout."""
from __future__ import annotations

import pytest
import torch

from engine_model.paged_step import paged_step, run_backend
from verifier_service.attention.metadata import AttentionMetadata, attention_context, current_attention_metadata
from verifier_service.attention.reference import ReferenceAttentionBackend

# (cached tokens, new query tokens) per sequence, block size
LAYOUTS = [
    ([0], [13], 4),  # one fresh prompt
    ([37], [1], 16),  # batch-1 decode
    ([20], [5], 8),  # batch-1 verify: last token + 4 drafts
    ([0, 9, 30, 17, 5], [11, 1, 4, 6, 3], 4),  # first chunk, decode, verify, later chunk, verify
    ([3, 3, 3], [4, 4, 4], 2),  # uniform query lengths (every sequence verifying 3 drafts)
    ([63, 0], [2, 64], 16),  # block boundaries exactly filled
]


@pytest.mark.parametrize("cached_lens, query_lens, block_size", LAYOUTS)
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_attention_equals_dense_causal_attention(cached_lens, query_lens, block_size, seed):
    step = paged_step(cached_lens, query_lens, block_size, seed)
    torch.testing.assert_close(run_backend(ReferenceAttentionBackend(), step), step.dense, atol=1e-5, rtol=1e-5)


def test_write_kv_stores_each_token_at_its_slot():
    backend = ReferenceAttentionBackend()
    k_cache, v_cache = torch.zeros(4, 2, 1, 3), torch.zeros(4, 2, 1, 3)
    key, value = torch.randn(3, 1, 3), torch.randn(3, 1, 3)
    metadata = AttentionMetadata.build([3], [3], [[3, 1]], [6, 7, 2], 2, torch.device("cpu"))
    backend.write_kv(key, value, k_cache, v_cache, metadata.slot_mapping)
    assert torch.equal(k_cache[3, 0], key[0]) and torch.equal(k_cache[3, 1], key[1])
    assert torch.equal(v_cache[1, 0], value[2]) and k_cache[0].abs().sum() == 0


def test_attention_context_refuses_to_nest():
    metadata = AttentionMetadata.build([1], [1], [[0]], [0], 16, torch.device("cpu"))
    with attention_context(metadata):
        assert current_attention_metadata() is metadata
        with pytest.raises(RuntimeError, match="nest"):
            with attention_context(metadata):
                pass
    with pytest.raises(RuntimeError, match="attention_context"):
        current_attention_metadata()

