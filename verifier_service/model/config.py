"""What our decoder needs to know about a checkpoint, read once from its Hugging Face config.

transformers is used here only to parse config.json (AutoConfig); the model itself is ours. The
supported families differ in three switches: q/k/v bias (Qwen2), QK-norm (Qwen3) and tied
embeddings; everything else (GQA, head_dim, RoPE scaling) is a plain number.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always, Llama/Qwen3 when attention_bias)
    o_bias: bool  # bias on the output projection (Llama/Qwen3 attention_bias)
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta and the scaling parameters
    torch_dtype: torch.dtype | None = None  # the checkpoint's own dtype, for dtype="auto"

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type: {self.model_type!r} is not supported (one of {SUPPORTED_MODEL_TYPES})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads: {self.num_kv_heads} does not divide {self.num_heads} heads")


def rope_parameters(hf_config) -> dict:
    """RoPE settings in the transformers 5 shape, also from v4 configs (`rope_scaling` + `rope_theta`)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.pop("type", None) or "default"
    return params


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Reads config.json of a Hugging Face checkpoint folder into a ModelConfig."""
    hf = AutoConfig.from_pretrained(str(model_dir))
    model_type = hf.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type: {model_type!r} is not supported (one of {SUPPORTED_MODEL_TYPES})")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    attention_bias = bool(getattr(hf, "attention_bias", False))
    max_positions = hf.max_position_embeddings
    sliding_window = getattr(hf, "sliding_window", None)
    if sliding_window and (model_type == "mistral" or getattr(hf, "use_sliding_window", False)):
        # Without sliding-window attention we are exact only up to the window.
        max_positions = min(max_positions, sliding_window)
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act: {hf.hidden_act!r} is not supported (only silu)")
    dtype = getattr(hf, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return ModelConfig(
        model_type=model_type,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        rope=rope_parameters(hf),
        torch_dtype=dtype if isinstance(dtype, torch.dtype) else None,
    )
