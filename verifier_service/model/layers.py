"""The building blocks of a Llama-style decoder layer: RMSNorm, attention over the paged cache, SwiGLU MLP.

q/k/v are one fused projection (`qkv_proj`) and gate/up another (`gate_up_proj`): one matmul instead of
three or two, which matters at batch-1 decode where per-op overhead dominates. The weight loader fills
the fused weights from the checkpoint's separate ones. A decoder layer is two attention-free regions
around the attention call (`attention_inputs`, `attention_output`), so that on CUDA each region can be
compiled into a few fused kernels (verifier_service/model/compile.py) while attention stays the backend's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from verifier_service.attention.backend import AttentionBackend
from verifier_service.attention.metadata import AttentionMetadata, current_attention_metadata
from verifier_service.model.config import ModelConfig
from verifier_service.model.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as transformers does, over the last dimension."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalize(x, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream's add and the norm of its result: (norm(residual + x), residual + x). A sharded
        model's norm sums x over the ranks first (sharding/layers.py: ReducingRMSNorm)."""
        residual = residual + x
        return self(residual), residual

    @staticmethod
    def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
        """x / rms(x) in x's dtype, before the weight (QK-norm applies per-head weights to it)."""
        # Spelled out rather than F.rms_norm, which is several times slower on the CPU for decode-sized inputs.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return h.to(x.dtype)


class Attention(nn.Module):
    """Self-attention with GQA; K/V live in the paged cache bound by `bind_kv_cache`."""

    rotate = staticmethod(RotaryEmbedding.apply)  # q and k by their positions (the deterministic mode fuses it)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.scale = self.head_dim ** -0.5
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, num_kv_heads, head_dim]
        self.v_cache: torch.Tensor | None = None
        self.backend: AttentionBackend | None = None

    def bind_kv_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, backend: AttentionBackend) -> None:
        self.k_cache, self.v_cache, self.backend = k_cache, v_cache, backend

    def project(self, hidden: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [num_tokens, hidden_size] -> q [num_tokens, heads, head_dim], k, v [num_tokens, kv_heads, head_dim].

        q and k come out normed (Qwen3) and rotated; cos, sin [num_tokens, 1, head_dim].
        """
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        v = qkv[:, self.q_size + self.kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        qk = qkv[:, :self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
        if self.q_norm is not None:
            qk = self.qk_norm_weight() * self.q_norm.normalize(qk, self.q_norm.eps)
        # q and k heads normed and rotated together: one fused kernel on CUDA instead of one each, and the
        # same float32 arithmetic per element as two separate norms and rotations on the CPU.
        q, k = self.rotate(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v

    def qk_norm_weight(self) -> torch.Tensor:
        """[heads + kv_heads, head_dim]: q_norm's weight for each query head, then k_norm's for each KV head."""
        return torch.cat([self.q_norm.weight.expand(self.num_heads, -1),
                          self.k_norm.weight.expand(self.num_kv_heads, -1)])

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Writes k, v to the cache, then q attends: [num_tokens, heads, head_dim] (before o_proj)."""
        metadata = current_attention_metadata()
        self.write_kv(k, v, metadata.slot_mapping)
        return self.attend_cached(q, metadata)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """k, v [num_tokens, kv_heads, head_dim] into the cache at slot_mapping [num_tokens]."""
        self.backend.write_kv(k, v, self.k_cache, self.v_cache, slot_mapping)

    def attend_cached(self, q: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """q attends to the cache, which already holds this step's keys and values (`write_kv`)."""
        return self.backend.attend(q, self.k_cache, self.v_cache, metadata, self.scale)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(self.gate_up_proj(x)))

    @staticmethod
    def activate(gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the fused projection's two halves (the deterministic mode fuses it)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.)).

    The residual stream travels beside the layer's output (vLLM's fused add + norm): a layer returns
    (MLP output, residual) and the next layer adds the two right before its input norm. On CUDA the add
    then lives in the next compiled region, inside the norm's kernel, instead of after the down projection
    (where the dynamic-shape graphs spend a device copy and a beta=1 GEMM on it). The float arithmetic is
    the same, in the same order, as adding at the end of the layer.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's MLP output (the embeddings for the first layer, whose residual is None),
        residual: the stream before it -> (this layer's MLP output, its residual stream), each
        [num_tokens, hidden_size]; attention runs between two compilable regions."""
        q, k, v, residual = self.attention_inputs(hidden, residual, cos, sin)
        return self.attention_output(residual, self.self_attn.attend(q, k, v))

    def attention_inputs(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Region 1: residual add, input norm, q/k/v projection, QK-norm, RoPE -> q, k, v (see
        Attention.project) and the residual stream."""
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            normed, residual = self.input_layernorm.add_forward(hidden, residual)
        return (*self.self_attn.project(normed, cos, sin), residual)

    def attention_output(self, residual: torch.Tensor,
                         attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Region 2: o_proj, residual add, post-attention norm, MLP -> (MLP output, residual stream).

        residual [num_tokens, hidden_size] is the stream entering the layer; attention [num_tokens, heads, head_dim].
        """
        attended = self.self_attn.o_proj(attention.reshape(residual.shape[0], self.self_attn.q_size))
        normed, residual = self.post_attention_layernorm.add_forward(attended, residual)
        return self.mlp(normed), residual
