"""A split GEMM's partial sums, added by the kernel that reads the GEMM's output rather than by a kernel of its own.

kernels/triton_linear.py splits the K of a narrow weight over more programs, each summing its part into a float32
buffer, and a second kernel adds the parts. So a linear whose output goes straight into one of the deterministic
mode's own elementwise kernels (an RMSNorm with its residual add, SiLU-and-multiply, RoPE) hands that kernel its
`SplitSums` instead, and the kernel adds the parts as it loads them (`summed`): in split order, then the bias,
rounded to the GEMM's dtype, exactly as the adding kernel does. The bits are the same either way; the step has one
kernel fewer for each such linear: 120 on the default model. The first 90 (o_proj, gate_up_proj, down_proj) made
its batch-1 step 3% faster and its batch-64 step 4% (H100, docs/BENCHMARKS.md round 44). Adding the parts inside the GEMM kernel instead (its last split to
finish, found by an atomic counter) was slower: the fence and that tail cost more than a kernel boundary under PDL.

Importing this module needs triton.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl


@dataclasses.dataclass(frozen=True)
class SplitSums:
    """x @ weight.T (+ bias) not yet added up: parts [splits, rows, N] float32, each split's sum over its part of K;
    dtype, the GEMM's output dtype."""

    parts: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


@triton.jit
def summed(PARTS, BIAS, row, cols, mask, M, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Row `row`'s columns `cols` of the GEMM: its SPLITS parts (PARTS [SPLITS, M, N] float32) added in split order,
    then the bias (BIAS [N]), in float32. Round it to the GEMM's dtype to have its output."""
    acc = tl.load(PARTS + row * N + cols, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLITS):
        acc += tl.load(PARTS + split * M * N + row * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=mask, other=0.0).to(tl.float32)
    return acc
