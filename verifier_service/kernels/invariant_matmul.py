"""y = x W^T + b with one summation order per weight, whatever the number of rows (the deterministic mode on CUDA).

cuBLAS picks its kernel, its tiles and its split-K from the whole GEMM's shape, so a token's logits differ in the
last bits between a 1-row decode step, a 5-row verify step and a 64-row batch; in bfloat16 that flips near-tie
argmaxes. Here one Triton kernel computes every output element as the sum of its K slices in order, each slice one
tl.dot, with tiles (and a split of K, if any) fixed per weight shape: the number of rows only changes how many
programs run, never what one of them does with a row (as Thinking Machines' batch-invariant matmul, without its
persistent scheduling).

Importing this module needs triton (the deterministic mode on CUDA imports it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

@triton.jit(do_not_specialize=["rows", "stride_x"])
def _linear_kernel(X, W, BIAS, Y, PARTS, rows, stride_x, N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr,
                   SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    # X [rows, K] (row stride stride_x), W [N, K] contiguous, BIAS [N], Y [rows, N] contiguous;
    # PARTS [SPLITS, rows, N] float32: split s's sum over K [s * K_SPLIT, (s + 1) * K_SPLIT) (SPLITS > 1 only).
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = m < rows, n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(split * K_SPLIT, tl.minimum(split * K_SPLIT + K_SPLIT, K), BLOCK_K):  # in order
        k_ok = start + k < K
        x = tl.load(X + m[:, None].to(tl.int64) * stride_x + (start + k)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + n[:, None].to(tl.int64) * K + (start + k)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    out = m[:, None].to(tl.int64) * N + n[None, :]
    if SPLITS == 1:
        if HAS_BIAS:
            acc += tl.load(BIAS + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:
        tl.store(PARTS + split.to(tl.int64) * rows * N + out, acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["size"])
def _sum_splits_kernel(PARTS, BIAS, Y, size, N: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr):
    # Y.flat[i] = ((PARTS[0].flat[i] + PARTS[1].flat[i]) + ...) + BIAS[i % N]: the splits in order.
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < size
    acc = tl.load(PARTS + i, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(PARTS + s * size + i, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + i % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + i, acc.to(Y.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class Tiles:
    """One weight shape's launch: what every row of every step of that shape runs with. K is summed in `splits`
    consecutive ranges by separate programs, whose float32 sums are then added in order: a fixed split-K, so that
    a one-row step of a weight with few output columns still keeps the SMs busy."""
    block_m: int = 64
    block_n: int = 32
    block_k: int = 256
    splits: int = 1
    stages: int = 4
    warps: int = 4


PROGRAMS = 264  # a one-row step's programs wanted (two per SM of an H100 / H200); a constant, so every card splits alike


def tiles_for(out_features: int, in_features: int) -> Tiles:
    """The tiles of a weight shape (never of a row count), from bench/invariant_matmul.py's sweep on an H200: wide
    blocks for wide weights, long K blocks otherwise, and K split in ranges of at least 1,024 until a one-row step
    has about PROGRAMS programs."""
    block_n = 128 if out_features >= 16384 else 64 if out_features >= 2048 else 32
    block_k = 64 if block_n == 128 else 256
    columns = triton.cdiv(out_features, block_n)
    splits = max(1, min(PROGRAMS // columns, in_features // 1024))
    return Tiles(block_n=block_n, block_k=block_k, splits=splits)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., K] (rows contiguous), weight [N, K], bias [N] or None -> [..., N] in x's dtype. `tiles`: the
    weight shape's own unless given (bench/invariant_matmul.py compares others)."""
    shape, (out_features, in_features) = x.shape, weight.shape
    x = x.reshape(-1, in_features)
    if x.stride(1) != 1:
        x = x.contiguous()
    if not weight.is_contiguous():
        raise ValueError("weight: must be contiguous")
    rows = x.shape[0]
    y = torch.empty(rows, out_features, device=x.device, dtype=x.dtype)
    if rows:
        tiles = tiles or tiles_for(out_features, in_features)
        k_split = triton.cdiv(triton.cdiv(in_features, tiles.splits), tiles.block_k) * tiles.block_k
        parts = (torch.empty(tiles.splits, rows, out_features, device=x.device, dtype=torch.float32)
                 if tiles.splits > 1 else y)
        bias_or_any = bias if bias is not None else weight
        grid = (triton.cdiv(rows, tiles.block_m), triton.cdiv(out_features, tiles.block_n), tiles.splits)
        _linear_kernel[grid](x, weight, bias_or_any, y, parts, rows, x.stride(0), N=out_features, K=in_features,
                             K_SPLIT=k_split, SPLITS=tiles.splits, HAS_BIAS=bias is not None, BLOCK_M=tiles.block_m,
                             BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                             PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=tiles.warps,
                             num_stages=tiles.stages)
        if tiles.splits > 1:
            size = rows * out_features
            _sum_splits_kernel[(triton.cdiv(size, 1024),)](parts, bias_or_any, y, size, N=out_features,
                                                           SPLITS=tiles.splits, HAS_BIAS=bias is not None,
                                                           BLOCK=1024, num_warps=4)
    return y.view(*shape[:-1], out_features)
