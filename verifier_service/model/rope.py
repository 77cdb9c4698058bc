"""Rotary position embedding (RoPE, arXiv 2104.09864) in the Llama "rotate half" layout.

cos/sin are tabulated once for every position up to max_position in float32, so a step only
indexes the table by its positions (once, for all layers); the inverse frequencies follow transformers' definitions for
the `default`, `linear` and `llama3` rope types.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def inverse_frequencies(rope: dict, head_dim: int) -> torch.Tensor:
    """Per-pair rotation speeds [head_dim // 2] for a RoPE parameter dict (transformers 5 shape)."""
    rope_type = rope.get("rope_type", "default")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope["rope_theta"] ** exponents)
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope["factor"]
    if rope_type == "llama3":
        return _llama3_scaling(inv_freq, rope)
    raise ValueError(f"rope_parameters.rope_type: {rope_type!r} is not supported (default, linear, llama3)")


def _llama3_scaling(inv_freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Llama 3.1: slow down low frequencies by `factor`, keep high ones, interpolate between."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin table; `lookup` gathers rows for a step, `apply` rotates q or k."""

    def __init__(self, rope: dict, head_dim: int, max_position: int):
        super().__init__()
        self.rope, self.head_dim, self.max_position = rope, head_dim, max_position
        self.register_buffer("cos_sin", self._table(device=None), persistent=False)

    def _table(self, device: torch.device | None) -> torch.Tensor:
        inv_freq = inverse_frequencies(self.rope, self.head_dim).to(device)
        positions = torch.arange(self.max_position, dtype=torch.float32, device=inv_freq.device)
        angles = torch.outer(positions, inv_freq)  # [max_position, head_dim // 2]
        cos, sin = angles.cos(), angles.sin()
        # sin carries rotate-half's sign, so apply() needs only a roll: [-sin | sin] * [x2 | x1] = rotate_half(x) * sin.
        return torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)))  # [2, max_position, head_dim]

    def rebuild(self, device: torch.device) -> None:
        """Recomputes the table on `device` (after the model was materialised from the meta device)."""
        self.cos_sin = self._table(device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [num_tokens, 1, head_dim] for `positions` [num_tokens], in the model dtype."""
        table = self.cos_sin[:, positions].to(dtype)
        return table[0].unsqueeze(1), table[1].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates x [num_tokens, num_heads, head_dim] by its positions' angles."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
