"""The deterministic mode's layers on CUDA: every linear in fixed-row cuBLAS GEMMs (or, under
SPECD_DETERMINISTIC_GEMMS=triton / triton-split, the fixed-tile Triton GEMM) and every RMSNorm through a
batch-invariant Triton kernel (kernels/invariant_norm.py), so that no reduction's order depends on the step. The
mode's own kernels launch with programmatic dependent launch (kernels/pdl.py), so that with the Triton GEMM a step's
kernels form one chain, as the default mode's do.

The rest of a layer is elementwise (RoPE, SiLU and its product), which is batch-invariant as it is (here one
kernel each, kernels/fused_elementwise.py), and attention is the backend's (attention/triton_invariant.py).
Regions are not compiled in this mode: Inductor fuses differently per graph (a one-row graph turns a GEMM into a
reduction), so the same token would round differently in a decode and a verify step. CUDA graphs still capture
every step.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from specd import environment
from verifier_service.kernels import pdl
from verifier_service.kernels.fused_elementwise import rope, silu_and_mul
from verifier_service.kernels.gemm_rows import GEMM_ROWS, whole_chunks
from verifier_service.kernels.invariant_norm import rms_norm
from verifier_service.kernels.split_sums import SplitSums
from verifier_service.kernels.triton_linear import linear as triton_linear
from verifier_service.model.layers import MLP, Attention, RMSNorm

TRITON_ROW_TILE = 16  # the Triton GEMM's rows a tile under SPECD_DETERMINISTIC_GEMMS=triton*, in every step
# "auto" runs the Triton GEMM with K split for models this wide or narrower where PDL is on (Hopper and later: what it
# was measured with), cuBLAS's 64-row GEMMs otherwise. On an H200 (docs/BENCHMARKS.md round 41) the default model
# (576) took 0.98 ms a batch-1 step with it against 1.15 with cuBLAS; Qwen3-8B's shapes (4,096) took 8.0 ms with it,
# against 5.5, where cuBLAS's GEMMs are tuned for big weights.
TRITON_MAX_HIDDEN = 1024
# The linears whose output goes straight into one of the mode's kernels that add a split GEMM's parts themselves
# (kernels/split_sums.py): o_proj and down_proj into the next RMSNorm's residual add (the post-attention norm, the
# next layer's input norm or the final norm), gate_up_proj into SiLU-and-multiply; and qkv_proj, in a model without
# QK-norm, into RoPE (project_from_parts). The LM head's output is the logits: it adds its own.
SUMS_AHEAD = frozenset({"o_proj", "down_proj", "gate_up_proj"})


class InvariantLinear(nn.Module):
    """nn.Linear's parameters (shared, not copied: a tied LM head stays tied), computed in GEMMs of exactly
    GEMM_ROWS rows (the last one read whole from a buffer with room for it: kernels/gemm_rows.py), as the CPU's
    deterministic linears run oneDNN in fixed-row chunks (model/cpu_linear.py). cuBLAS then picks one kernel, tiles and split of K for the weight whatever the step,
    and a GEMM sums each output element of a row from that row and the weight alone: a row's bits do not depend on
    the rows beside it. At 1 to 64 rows a 64-row GEMM streams the same weight bytes as a 1-row one (within 5% on an
    H200 for Qwen3-8B's and the default model's weights); prompt chunks pay one weight read per 64 rows.

    With gemms "triton" / "triton-split" the fixed-tile Triton GEMM (kernels/triton_linear.py) runs instead: its tiles
    and its K split come from the weight's shape alone, and it launches with PDL, as the mode's other kernels do."""

    def __init__(self, module: nn.Linear, gemms: str = "cublas", sums_ahead: bool = False):
        """gemms: SPECD_DETERMINISTIC_GEMMS; "triton" / "triton-split" run the fixed-tile Triton GEMM instead, its
        row tile (TRITON_ROW_TILE) and K split (from the weight's shape alone) the same whatever the step.
        sums_ahead: the output goes straight into a kernel that adds a split GEMM's parts itself
        (kernels/split_sums.py), so a split GEMM returns its SplitSums."""
        super().__init__()
        self.in_features, self.out_features = module.in_features, module.out_features
        self.weight, self.bias = module.weight, module.bias
        self.gemms, self.sums_ahead = gemms, sums_ahead

    def forward(self, x: torch.Tensor) -> torch.Tensor | SplitSums:
        """x [rows, in_features] -> [rows, out_features] (or, sums_ahead, a split GEMM's SplitSums of that shape)."""
        if self.gemms != "cublas":
            return triton_linear(x, self.weight, self.bias, block_m=TRITON_ROW_TILE,
                                 split_k=self.gemms == "triton-split", sums_ahead=self.sums_ahead)
        rows = x.shape[0]
        x = whole_chunks(x)  # [whole GEMMs of rows, in_features]
        y = x.new_empty(x.shape[0], self.out_features)
        weight = self.weight.t()
        for first in range(0, y.shape[0], GEMM_ROWS):
            chunk, out = x[first:first + GEMM_ROWS], y[first:first + GEMM_ROWS]
            if self.bias is None:
                torch.mm(chunk, weight, out=out)
            else:
                torch.addmm(self.bias, chunk, weight, out=out)
        return y[:rows]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"gemms={self.gemms}, sums_ahead={self.sums_ahead}")


class InvariantRMSNorm(RMSNorm):
    """RMSNorm (and its residual add) with each row reduced alone, in one order."""

    def __init__(self, module: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps = module.weight, module.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)[0]

    def add_forward(self, x: torch.Tensor | SplitSums, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.eps, self.weight, residual)

    @staticmethod
    def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, eps)[0]


def project_from_parts(attention: Attention, hidden: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention.project for a model without QK-norm: the q/k/v projection hands its parts on, and one kernel adds
    them, rotates q and k and writes v as it is (the adding kernel and RoPE's, bit for bit, one kernel fewer)."""
    heads = attention.num_heads + 2 * attention.num_kv_heads
    qkv = attention.qkv_proj(hidden)
    if not isinstance(qkv, SplitSums):
        qkv = qkv.view(hidden.shape[0], heads, attention.head_dim)
    qkv = rope(qkv, cos, sin, heads=heads, rotated=attention.num_heads + attention.num_kv_heads)
    return qkv.split([attention.num_heads, attention.num_kv_heads, attention.num_kv_heads], dim=1)


def _sums_ahead(parent: nn.Module, name: str) -> bool:
    """Whether the linear parent.name hands a split GEMM's parts to the kernel after it (SUMS_AHEAD, and a q/k/v
    projection that project_from_parts reads)."""
    return name in SUMS_AHEAD or (name == "qkv_proj" and isinstance(parent, Attention) and parent.q_norm is None)


def make_batch_invariant(model: nn.Module) -> None:
    """Replaces every nn.Linear and RMSNorm of model by its invariant twin, and RoPE and SiLU-and-multiply by one
    kernel each (kernels/fused_elementwise.py: fewer launches, as Inductor's fusion would give), in place."""
    gemms = environment.deterministic_gemms()
    if gemms == "auto":  # by the model and the card alone: one choice for every step
        narrow = model.config.hidden_size <= TRITON_MAX_HIDDEN
        gemms = "triton-split" if narrow and pdl.enabled(next(model.parameters()).device) else "cublas"
    for module in model.modules():
        if isinstance(module, Attention):
            module.rotate = rope
            if module.q_norm is None:  # q, k and v straight from the projection's parts (project_from_parts)
                module.project = functools.partial(project_from_parts, module)
        elif isinstance(module, MLP):
            module.activate = silu_and_mul
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, InvariantLinear(child, gemms, sums_ahead=_sums_ahead(parent, name)))
            elif type(child) is RMSNorm:
                setattr(parent, name, InvariantRMSNorm(child))
