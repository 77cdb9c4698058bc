"""One rank's part of the causal LM: our decoder built for the rank's heads and slices (shard.py), with
o_proj / down_proj row-parallel, the embedding vocab-parallel and the LM head's logits gathered. Where those
layers have no bias (every family we load, as published), the norm after each sums its output
(ReducingRMSNorm), so that the all-reduce and the residual add + norm can run as one kernel.

Everything else (layers, regions, attention, KV cache binding) is the single-GPU model's own code, built
from the rank's local ModelConfig, so a sharded forward runs the same kernels on smaller shapes.
"""
from __future__ import annotations

import torch
from torch import nn

from verifier_service.model.config import ModelConfig
from verifier_service.model.decoder import CausalLM
from verifier_service.model.layers import RMSNorm
from verifier_service.sharding.collectives import gather_vocab
from verifier_service.sharding.layers import ReducingRMSNorm, RowParallelLinear, VocabParallelEmbedding
from verifier_service.sharding.shard import RankShard


class ParallelCausalLM(CausalLM):
    """`config` is the whole model's; `self.config` becomes this rank's (shard.local_config)."""

    def __init__(self, config: ModelConfig, shard: RankShard, max_position: int | None = None):
        super().__init__(shard.local_config(config), max_position or config.max_position_embeddings)
        self.shard = shard
        self.model.embed_tokens = VocabParallelEmbedding(shard.vocab[0], shard.vocab_per_rank, config.hidden_size)
        norms_reduce = not (config.o_bias or config.mlp_bias)  # a bias is added after the sum, in the layer
        for layer in self.model.layers:
            layer.self_attn.o_proj = _row_parallel(layer.self_attn.o_proj, reduce_output=not norms_reduce)
            layer.mlp.down_proj = _row_parallel(layer.mlp.down_proj, reduce_output=not norms_reduce)
            if norms_reduce:  # o_proj's sum goes to the post-attention norm, down_proj's to the next layer's input norm
                layer.input_layernorm = _reducing(layer.input_layernorm)
                layer.post_attention_layernorm = _reducing(layer.post_attention_layernorm)
        if norms_reduce:  # and the last layer's to the final norm
            self.model.norm = _reducing(self.model.norm)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden_size] -> logits [n, vocab_size] of the whole vocabulary, on every rank."""
        return gather_vocab(self.lm_head(hidden), self.shard.vocab_size)


def _row_parallel(linear: nn.Linear, reduce_output: bool) -> RowParallelLinear:
    """A RowParallelLinear of linear's shape, dtype and device (the model is still on the meta device)."""
    return RowParallelLinear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                             device=linear.weight.device, dtype=linear.weight.dtype, reduce_output=reduce_output)


def _reducing(norm: RMSNorm) -> ReducingRMSNorm:
    """A ReducingRMSNorm of norm's size and eps (built under the meta device, as the rest of the model)."""
    return ReducingRMSNorm(norm.weight.shape[0], norm.eps)
