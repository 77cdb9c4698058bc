"""Who holds what: heads by KV group (evenly, unevenly, or with KV heads replicated), the MLP and vocabulary
in slices, the checkpoint rows and columns each rank reads; impossible splits name the field."""
from __future__ import annotations

import dataclasses

import pytest

from verifier_service.model.config import ModelConfig
from verifier_service.sharding.shard import balanced_span, plan_shard

LLAMA_70B = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                        max_position_embeddings=8192, tie_word_embeddings=False, qkv_bias=False, o_bias=False,
                        mlp_bias=False, qk_norm=False)
SMOLLM2_135M = dataclasses.replace(LLAMA_70B, vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                   num_heads=9, num_kv_heads=3, head_dim=64)


def shards(config, size):
    return [plan_shard(config, size, rank) for rank in range(size)]


def test_spans_cover_everything_once_and_differ_by_at_most_one():
    for total, parts in [(8, 4), (3, 2), (1536, 5), (7, 7)]:
        spans = [balanced_span(total, parts, i) for i in range(parts)]
        assert spans[0][0] == 0 and spans[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1


def test_even_split_gives_each_rank_its_kv_groups():
    ranks = shards(LLAMA_70B, 4)
    assert [s.kv_heads for s in ranks] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [s.q_heads for s in ranks] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    local = ranks[1].local_config(LLAMA_70B)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (16, 2, 7168, 32064)


def test_uneven_kv_heads_split_by_whole_groups():
    """SmolLM2-135M (the default model) over 2 ranks: 3 KV heads of 3 query heads each -> 2 + 1 groups."""
    first, second = shards(SMOLLM2_135M, 2)
    assert (first.kv_heads, first.q_heads) == ((0, 2), (0, 6))
    assert (second.kv_heads, second.q_heads) == ((2, 3), (6, 9))


def test_shapes_tell_whether_the_ranks_compile_the_same_kernels():
    """Shared tuning pairs the ranks' timings only where their shards have one shape (shared_tuning.py)."""
    assert len({s.shape for s in shards(LLAMA_70B, 4)}) == 1
    assert [s.shape for s in shards(SMOLLM2_135M, 2)] == [(6, 2, 768, 24576), (3, 1, 768, 24576)]


def test_fewer_kv_heads_than_ranks_are_replicated():
    ranks = shards(LLAMA_70B, 16)  # 8 KV heads, 2 ranks each; 8 query heads per KV head, 4 per rank
    assert [s.kv_heads for s in ranks[:4]] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [s.q_heads for s in ranks[:4]] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert ranks[5].local_config(LLAMA_70B).num_kv_heads == 1


@pytest.mark.parametrize("config, size, field", [
    (SMOLLM2_135M, 4, "tensor_parallel_size"),  # 4 ranks cannot share 3 KV heads equally
    (dataclasses.replace(SMOLLM2_135M, num_kv_heads=1), 2, "num_attention_heads"),  # 9 query heads over 2
    (LLAMA_70B, 0, "tensor_parallel_size"),
])
def test_impossible_splits_name_the_field(config, size, field):
    with pytest.raises(ValueError, match=field):
        plan_shard(config, size, 0)


def test_checkpoint_slices_are_the_rank_rows_and_columns():
    shard = shards(LLAMA_70B, 4)[1]
    layer = "model.layers.3."
    assert shard.checkpoint_slice(layer + "self_attn.q_proj.weight") == (0, 16 * 128, 32 * 128)
    assert shard.checkpoint_slice(layer + "self_attn.k_proj.bias") == (0, 2 * 128, 4 * 128)
    assert shard.checkpoint_slice(layer + "self_attn.o_proj.weight") == (1, 16 * 128, 32 * 128)
    assert shard.checkpoint_slice(layer + "self_attn.o_proj.bias") is None  # added once, after the all-reduce
    assert shard.checkpoint_slice(layer + "mlp.up_proj.weight") == (0, 7168, 14336)
    assert shard.checkpoint_slice(layer + "mlp.down_proj.weight") == (1, 7168, 14336)
    assert shard.checkpoint_slice(layer + "input_layernorm.weight") is None
    assert shard.checkpoint_slice("model.embed_tokens.weight") == (0, 32064, 64128)
    assert shards(dataclasses.replace(LLAMA_70B, vocab_size=10), 4)[3].checkpoint_slice("lm_head.weight") == (0, 9, 10)
