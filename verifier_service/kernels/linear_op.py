"""`torch.ops.specd.few_rows_mm` and `few_rows_gated_mm`: kernels/triton_linear.py's GEMM, and the same with SwiGLU's
activation computed as its input loads, as operators that compiled graphs can call.

Inductor keeps a custom operator as one opaque call in its generated code, so the Triton kernel launches as
triton_linear.py launches it (with PDL) from inside a compiled region. Torch-only at import: the operator's fake
(shape-only) version traces anywhere, and only running it on CUDA imports triton.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("specd::few_rows_mm", mutates_args=())
def few_rows_mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [rows, K] @ b [K, N] (+ bias [N]), as aten.mm / addmm give it (b a linear's weight, transposed)."""
    from verifier_service.kernels.triton_linear import linear

    return linear(a, b.t(), bias)


@few_rows_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


@torch.library.custom_op("specd::few_rows_gated_mm", mutates_args=())
def few_rows_gated_mm(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(silu(gate) * up, weight [N, K], bias): one kernel on CUDA; elsewhere the same, unfused."""
    if gate.device.type != "cuda":
        return F.linear(F.silu(gate) * up, weight, bias)
    from verifier_service.kernels.triton_linear import linear

    return linear(gate, weight, bias, up=up)


@few_rows_gated_mm.register_fake
def _(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return gate.new_empty(gate.shape[0], weight.shape[0])
