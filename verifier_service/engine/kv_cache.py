"""The paged KV cache tensors: how many blocks fit, and their allocation.

One block holds `block_size` consecutive tokens of one sequence, keys and values for every layer.
Per layer the layout is flash-attn's paged one: k_cache, v_cache [num_blocks, block_size, num_kv_heads,
head_dim]. All layers live in one allocation [2, num_layers, num_blocks, ...] so that sizing is exact.
On the CPU the number of blocks comes from a byte budget; on CUDA from the memory left after the
model is loaded, up to a fraction of the card.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from verifier_service.model.config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes that one block takes across all layers, keys and values."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element_size


def num_blocks_for_budget(budget_bytes: int, block_bytes: int) -> int:
    """Blocks that fit in `budget_bytes`; fails when not even one does."""
    num_blocks = budget_bytes // block_bytes
    if num_blocks < 1:
        raise ValueError(f"kv_cache_bytes: {budget_bytes} bytes hold no KV block (one takes {block_bytes})")
    return num_blocks


def num_blocks_for_gpu(device: torch.device, memory_fraction: float, block_bytes: int) -> int:
    """Blocks that fit in `memory_fraction` of the card, less what is already in use (model, activations)."""
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"gpu_memory_utilization: {memory_fraction} is not in (0, 1]")
    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * memory_fraction) - (total - free)
    return num_blocks_for_budget(max(budget, 0), block_bytes)


@dataclass
class KVCache:
    k_caches: list[torch.Tensor]  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    v_caches: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> "KVCache":
        """One zeroed allocation viewed as per-layer key and value caches."""
        storage = torch.zeros(2, config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim,
                              dtype=dtype, device=device)
        return cls(list(storage[0].unbind(0)), list(storage[1].unbind(0)), num_blocks, block_size)
