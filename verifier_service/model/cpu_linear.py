"""Linear layers on the CPU through oneDNN with weights reordered once at load.

A verifier step on the CPU is almost all GEMM time (~87% of a default-model decode step is `aten::mm`),
and the GEMMs are skinny: 1 row per sequence at decode, k + 1 at verify. PyTorch's float32 `F.linear`
goes to MKL, which on this project's CI CPUs (AMD EPYC) runs those shapes at a fraction of memory
bandwidth and gets *slower per row* as rows are added: a 9-row verify GEMM costs ~4x a 1-row one,
which eats most of what speculation saves. oneDNN with the weight pre-reordered into its blocked layout
(the path inductor's `freezing` takes) is 2-7x faster on these shapes (a 49152 x 576 LM head: 7.1 ->
2.9 ms at 1 row, 15.2 -> 3.2 ms at 9 rows) and ~2x at prefill sizes, with no compile step.

The results are float32 GEMMs with a different summation order: they differ from MKL's in the last
bits (~1e-6 relative), the same order of difference as between two batch sizes. `SPECD_ONEDNN_LINEAR=0`
keeps `nn.Linear` (e.g. to compare bit for bit against another MKL-based implementation).
"""
from __future__ import annotations

import os

import torch
from torch import nn

ONEDNN_LINEAR_ENV = "SPECD_ONEDNN_LINEAR"
_DTYPES = (torch.float32, torch.bfloat16)


def onednn_linear_enabled(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether prepack_linears applies: CPU, float32 / bfloat16, oneDNN built in, not switched off."""
    return (device.type == "cpu" and dtype in _DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and os.environ.get(ONEDNN_LINEAR_ENV, "1") != "0")


class PrepackedLinear(nn.Module):
    """y = x W^T + b, with W held only in oneDNN's reordered layout (no dense copy kept)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.register_buffer("packed_weight", weight, persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, in_features] -> [num_tokens, out_features]."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepack_linears(model: nn.Module) -> int:
    """Replaces every nn.Linear in model by a PrepackedLinear (in place); returns how many.

    A tied LM head gets its own packed copy; the embedding keeps the dense matrix it looks rows up in.
    """
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PrepackedLinear(child))
                replaced += 1
    return replaced
