"""The deterministic mode's layers on CUDA: every linear and RMSNorm through the batch-invariant Triton kernels
(kernels/invariant_matmul.py, kernels/invariant_norm.py), so that no reduction's order depends on the step.

The rest of a layer is elementwise (RoPE, SiLU and its product), which is batch-invariant as it is (here one
kernel each, kernels/fused_elementwise.py), and attention is the backend's (attention/triton_invariant.py). Regions are not compiled in this mode: Inductor fuses
differently per graph (a one-row graph turns a GEMM into a reduction), so the same token would round differently
in a decode and a verify step. CUDA graphs still capture every step.
"""
from __future__ import annotations

import torch
from torch import nn

from verifier_service.kernels.fused_elementwise import rope, silu_and_mul
from verifier_service.kernels.invariant_matmul import linear
from verifier_service.kernels.invariant_norm import rms_norm
from verifier_service.model.layers import MLP, Attention, RMSNorm


class InvariantLinear(nn.Module):
    """nn.Linear's parameters (shared, not copied: a tied LM head stays tied), computed by the invariant kernel."""

    def __init__(self, module: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = module.in_features, module.out_features
        self.weight, self.bias = module.weight, module.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class InvariantRMSNorm(RMSNorm):
    """RMSNorm (and its residual add) with each row reduced alone, in one order."""

    def __init__(self, module: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps = module.weight, module.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)[0]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.eps, self.weight, residual)

    @staticmethod
    def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, eps)[0]


def make_batch_invariant(model: nn.Module) -> None:
    """Replaces every nn.Linear and RMSNorm of model by its invariant twin, and RoPE and SiLU-and-multiply by one
    kernel each (kernels/fused_elementwise.py: fewer launches, as Inductor's fusion would give), in place."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.rotate = rope
        elif isinstance(module, MLP):
            module.activate = silu_and_mul
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, InvariantLinear(child))
            elif type(child) is RMSNorm:
                setattr(parent, name, InvariantRMSNorm(child))
