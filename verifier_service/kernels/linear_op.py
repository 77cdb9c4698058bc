"""`torch.ops.specd.few_rows_mm`: kernels/triton_linear.py's GEMM as an operator that compiled graphs can call.

Inductor keeps a custom operator as one opaque call in its generated code, so the Triton kernel launches as
triton_linear.py launches it (with PDL) from inside a compiled region. Torch-only at import: the operator's fake
(shape-only) version traces anywhere, and only running it on CUDA imports triton.
"""
from __future__ import annotations

import torch

@torch.library.custom_op("specd::few_rows_mm", mutates_args=())
def few_rows_mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [rows, K] @ b [K, N] (+ bias [N]), as aten.mm / addmm give it (b a linear's weight, transposed)."""
    from verifier_service.kernels.triton_linear import linear

    return linear(a, b.t(), bias)


@few_rows_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])
