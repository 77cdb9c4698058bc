"""The causal language model: embeddings, decoder layers, final norm, LM head.

One class covers the Llama / Mistral, Qwen2 and Qwen3 families (their differences are switches in
ModelConfig). Sequences are flattened: `forward(input_ids, positions)` takes every scheduled token of
the step at once; which token belongs to which sequence is the attention metadata's business.
Parameter names follow Hugging Face's, except the fused `qkv_proj` and `gate_up_proj`.
"""
from __future__ import annotations

import torch
from torch import nn

from verifier_service.attention.backend import AttentionBackend
from verifier_service.model.config import ModelConfig
from verifier_service.model.layers import DecoderLayer, RMSNorm
from verifier_service.model.rope import RotaryEmbedding


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_position)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> hidden [num_tokens, hidden_size]."""
        hidden, residual = self.embed_tokens(input_ids), None
        cos, sin = self.rotary.lookup(positions, hidden.dtype)  # once per step, shared by all layers
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin)
        return self.final_norm(hidden, residual)

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The last layer's residual add and the final norm (one compiled region on CUDA)."""
        return self.norm.add_forward(hidden, residual)[0]


class CausalLM(nn.Module):
    """Decoder plus LM head; `lm_head` shares the embedding matrix when the checkpoint ties them."""

    def __init__(self, config: ModelConfig, max_position: int | None = None):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_position or config.max_position_embeddings)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def tie_embeddings(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> hidden [num_tokens, hidden_size] (run inside attention_context)."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden_size] -> logits [n, vocab_size] in the model dtype."""
        return self.lm_head(hidden)

    def bind_kv_cache(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                      backend: AttentionBackend) -> None:
        """Gives layer i its cache tensors k_caches[i], v_caches[i] [num_blocks, block_size, kv_heads, head_dim]."""
        if len(k_caches) != len(self.model.layers):
            raise ValueError(f"k_caches: {len(k_caches)} layers given, the model has {len(self.model.layers)}")
        for layer, k_cache, v_cache in zip(self.model.layers, k_caches, v_caches):
            layer.self_attn.bind_kv_cache(k_cache, v_cache, backend)
