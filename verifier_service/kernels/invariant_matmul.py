"""y = x W^T + b with one summation order per weight, whatever the number of rows (the deterministic mode on CUDA).

cuBLAS picks its kernel, its tiles and its split-K from the whole GEMM's shape, so a token's logits differ in the
last bits between a 1-row decode step, a 5-row verify step and a 64-row batch; in bfloat16 that flips near-tie
argmaxes. Here one Triton kernel computes every output element as the sum of its K slices in order, each slice one
tl.dot, with tiles fixed per weight shape: the number of rows only changes how many programs run, never what one
of them does with a row (as Thinking Machines' batch-invariant matmul, without its persistent scheduling).

Importing this module needs triton (the deterministic mode on CUDA imports it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_K = 64, 64


@triton.jit(do_not_specialize=["rows", "stride_x"])
def _linear_kernel(X, W, BIAS, Y, rows, stride_x, N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    # X [rows, K] (row stride stride_x), W [N, K] contiguous, BIAS [N], Y [rows, N] contiguous.
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = m < rows, n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):  # K slices in order: the one summation order of every element
        k_ok = start + k < K
        x = tl.load(X + m[:, None].to(tl.int64) * stride_x + (start + k)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + n[:, None].to(tl.int64) * K + (start + k)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(BIAS + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + m[:, None].to(tl.int64) * N + n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def block_n(out_features: int) -> int:
    """Output columns per program: narrower for narrow weights, so a one-row step still spreads over the SMs."""
    return 32 if out_features <= 4096 else 64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (rows contiguous), weight [N, K], bias [N] or None -> [..., N] in x's dtype."""
    shape, (out_features, in_features) = x.shape, weight.shape
    x = x.reshape(-1, in_features)
    if x.stride(1) != 1:
        x = x.contiguous()
    if not weight.is_contiguous():
        raise ValueError("weight: must be contiguous")
    rows = x.shape[0]
    y = torch.empty(rows, out_features, device=x.device, dtype=x.dtype)
    if rows:
        tile_n = block_n(out_features)
        grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(out_features, tile_n))
        _linear_kernel[grid](x, weight, bias if bias is not None else weight, y, rows, x.stride(0),
                             N=out_features, K=in_features, HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M,
                             BLOCK_N=tile_n, BLOCK_K=BLOCK_K,
                             PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=4, num_stages=3)
    return y.view(*shape[:-1], out_features)
