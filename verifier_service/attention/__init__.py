"""Paged attention backends behind one small interface (flash-attn on CUDA, a PyTorch reference anywhere)."""
