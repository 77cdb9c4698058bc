"""The attention backend interface, and the choice of backend for a device.

A backend does two things per layer and step: store the step's new keys and values in the paged
cache (`write_kv`), then attend every query token to its sequence's cached keys (`attend`; causally: the
query at position p sees positions <= p). The cache layout is flash-attn's paged one, per layer:
k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim].
"""
from __future__ import annotations

import importlib.util
from typing import Protocol

import torch

from verifier_service.attention import FLASH_BLOCK_SIZE_MULTIPLE
from verifier_service.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Stores key, value [num_tokens, num_kv_heads, head_dim] at slot_mapping [num_tokens] (the step's
        metadata.slot_mapping, or a captured graph's buffer of it)."""
        ...

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> output [num_tokens, num_heads, head_dim]."""
        ...


def flash_attn_available(device: torch.device) -> bool:
    return device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None


def select_backend(device: torch.device | str, block_size: int | None = None,
                   dtype: torch.dtype | None = None) -> AttentionBackend:
    """flash-attn on CUDA when importable and the cache fits it (block_size % 256, half precision), else the reference."""
    device = torch.device(device)
    fits = block_size is None or block_size % FLASH_BLOCK_SIZE_MULTIPLE == 0
    fits = fits and dtype in (None, torch.float16, torch.bfloat16)
    if flash_attn_available(device) and fits:
        from verifier_service.attention.flash import FlashAttentionBackend

        return FlashAttentionBackend()
    from verifier_service.attention.reference import ReferenceAttentionBackend

    return ReferenceAttentionBackend()
