"""Paged attention backends behind one small interface (flash-attn on CUDA, a PyTorch reference anywhere)."""

FLASH_BLOCK_SIZE_MULTIPLE = 256  # flash-attn 2 paged KV requires block_size % 256 == 0 (torch-free: the config reads it)
