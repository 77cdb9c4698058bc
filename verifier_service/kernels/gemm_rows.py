"""Room for whole GEMM chunks: the deterministic mode runs every linear in GEMMs of exactly GEMM_ROWS rows
(model/invariant_layers.py), so an input of fewer rows needs a buffer that holds the last chunk whole.

The mode's kernels that feed a linear (the norm, SiLU-and-multiply, attention) allocate their outputs with that room
(`empty_rows`), and the linear reads its chunks in place (`whole_chunks`) instead of padding each input: two kernels
fewer per linear (a fill and a copy, 15% of a batch-1 step of the default model on an H200). What the spare rows
hold never matters: a GEMM computes each output row from its own input row alone, and nothing reads the spare rows'
outputs. Torch-only: importing it needs no triton.
"""
from __future__ import annotations

import torch

GEMM_ROWS = 64  # every GEMM of the mode has exactly this many rows


def padded(rows: int) -> int:
    """rows rounded up to whole GEMMs."""
    return -(-rows // GEMM_ROWS) * GEMM_ROWS


def empty_rows(shape: tuple[int, ...] | torch.Size, like: torch.Tensor,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.empty(shape) on like's device and dtype (or `dtype`), as the first shape[0] rows of a buffer of
    padded(shape[0])."""
    rows, *rest = shape
    return torch.empty((padded(rows), *rest), device=like.device, dtype=dtype or like.dtype)[:rows]


def whole_chunks(x: torch.Tensor) -> torch.Tensor:
    """x [rows, cols] as [padded(rows), cols], its first rows x's: read in place where x is contiguous and its
    storage reaches that far (an `empty_rows` output), else copied into a buffer that does."""
    rows, cols = x.shape
    total = padded(rows)
    if total == rows:
        return x
    fits = (x.storage_offset() + total * cols) * x.element_size() <= x.untyped_storage().nbytes()
    if not (x.stride() == (cols, 1) and fits):
        x = empty_rows(x.shape, x).copy_(x)
    return x.as_strided((total, cols), (cols, 1))
