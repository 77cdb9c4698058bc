"""x @ weight.T (+ bias) as one Triton kernel of fixed tiles, launched with PDL (pdl.py).

It launches with PDL, where cuBLAS's kernels do not: a batch-1 verify step's 4 GEMMs a layer are then launched while
the kernel before them finishes, as a decode step's (Inductor's reductions) already are. GEMMs of up to 128 rows
take it where PDL is on (SPECD_FEW_ROW_GEMMS, model/compile.py): the default model's k = 4 step through the stack at
batch 1 takes 0.72-0.74 against 0.79-0.84 ms with cuBLAS (H200, docs/BENCHMARKS.md round 37); at 64 clients two
calls disagree (rounds 38-39).

Each output tile is one program and its sum over K runs in BLOCK_K steps in one order, the tiles fixed by the
weight's shape and block_m: a row's bits do not depend on the rows beside it. The deterministic mode runs every
linear of a narrow model here, 16-row tiles with K split (model/invariant_layers.py, SPECD_DETERMINISTIC_GEMMS): with
its own kernels launched with PDL too, the default model's batch-1 step took 0.98 ms against 1.15 with cuBLAS's
64-row GEMMs (H200, docs/BENCHMARKS.md round 41); on Qwen3-8B's shapes it was slower than cuBLAS.

The first weight tile loads before the prologue's wait: no kernel writes a weight, only x waits for the kernel before.

SPECD_FEW_ROW_GEMMS_SPLIT_K ("1": every GEMM; "tile": GEMMs of one row tile; "0", the default: none) splits the K of a
weight whose column tiles leave most SMs idle (k_split, from its shape alone), each split summed into a float32 buffer
and the splits added in order by a second kernel. Split in every GEMM, a batch-1 k = 4 verify step's device time was
0.89x in the engine's loop, a step's 64-row GEMMs 1.10x slower (H200, docs/BENCHMARKS.md round 39); split in one row
tile, the stack with the real weights at one client was as fast as without, in both orders (round 40). Under "tile" a
row's bits depend on whether its GEMM has more rows than one tile (the deterministic mode passes split_k itself).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specd import environment
from verifier_service.kernels import pdl
from verifier_service.kernels.split_sums import SplitSums, summed
from verifier_service.kernels.triton_pdl import prologue


@triton.jit
def _dot(x, w, acc, IEEE: tl.constexpr):
    if IEEE:  # float32 in float32, not TF32
        return tl.dot(x, w, acc, input_precision="ieee")
    return tl.dot(x, w, acc)


@triton.jit
def _x_tile(x_ptr, rows, k, M, K, stride_xm, stride_xk):
    return tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :] * stride_xk,
                   mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)


@triton.jit
def _w_tile(w_ptr, cols, k, N, K, stride_wn, stride_wk):  # [BLOCK_K, BLOCK_N]: the weight's tile, transposed
    return tl.load(w_ptr + cols[None, :] * stride_wn + k[:, None] * stride_wk,
                   mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0)


@triton.jit
def _tile_sum(x_ptr, w_ptr, rows, cols, first, end, M, N, stride_xm, stride_xk, stride_wn, stride_wk,
              IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              PDL: tl.constexpr):
    """The [rows, cols] tile's sum over K's elements first..end, BLOCK_K at a time in one order, in float32; the
    first weight tile loads before the prologue's wait (no kernel writes a weight)."""
    ks = first + tl.arange(0, BLOCK_K)
    w = _w_tile(w_ptr, cols, ks, N, end, stride_wn, stride_wk)
    prologue(PDL)
    x = _x_tile(x_ptr, rows, ks, M, end, stride_xm, stride_xk)
    acc = _dot(x, w, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), IEEE)
    for start in range(first + BLOCK_K, end, BLOCK_K):
        x = _x_tile(x_ptr, rows, start + tl.arange(0, BLOCK_K), M, end, stride_xm, stride_xk)
        w = _w_tile(w_ptr, cols, start + tl.arange(0, BLOCK_K), N, end, stride_wn, stride_wk)
        acc = _dot(x, w, acc, IEEE)
    return acc


@triton.jit
def _linear_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_ym,
                   HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _tile_sum(x_ptr, w_ptr, rows, cols, 0, K, M, N, stride_xm, stride_xk, stride_wn, stride_wk,
                    IEEE, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _partial_kernel(x_ptr, w_ptr, part_ptr, M, N, K, K_SPLIT, stride_xm, stride_xk, stride_wn, stride_wk,
                    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PDL: tl.constexpr):
    """One tile's sum over one of K's splits (program_id(2)), in float32 into part [split, M, N]."""
    split = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    first = split * K_SPLIT
    acc = _tile_sum(x_ptr, w_ptr, rows, cols, first, tl.minimum(first + K_SPLIT, K), M, N, stride_xm, stride_xk,
                    stride_wn, stride_wk, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
    tl.store(part_ptr + split * M * N + rows[:, None] * N + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _sum_splits_kernel(part_ptr, bias_ptr, y_ptr, M, N, stride_ym, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y [row, cols] = the splits' partial sums added in split order (+ bias): the same order for any M."""
    row = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    prologue(PDL)
    acc = summed(part_ptr, bias_ptr, row, cols, mask, M, N, SPLITS, HAS_BIAS)
    tl.store(y_ptr + row * stride_ym + cols, acc.to(y_ptr.dtype.element_ty), mask=mask)


def tiles(out_features: int, block_m: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for a weight of out_features rows: from the weight's shape and
    block_m alone, so every step of any row count runs the same tiles. Narrow column tiles for narrow weights keep
    the small models' projections spread over the SMs (the default model's o_proj is 576 wide: 18 programs)."""
    block_n = 32 if out_features <= 1024 else 64 if block_m <= 16 else 128
    return block_n, 64 if block_m > 16 else 128, 4, 3


# Programs a GEMM aims for: the default model's projections are 576-3,072 wide, 18-48 column tiles, so most of an
# H200's 132 SMs would idle through K's loop; split K until the tiles of 16 rows reach this many programs.
TARGET_PROGRAMS = 128
SPLIT_BLOCK_K = 64  # K's step within a split


@functools.cache
def k_split(out_features: int, in_features: int, block_m: int) -> int:
    """The K elements each program sums (a multiple of SPLIT_BLOCK_K; in_features: no split), from the weight's
    shape and block_m alone, so that a row's bits do not depend on the rows beside it."""
    block_n = tiles(out_features, block_m)[0]
    column_tiles = -(-out_features // block_n)
    steps = -(-in_features // SPLIT_BLOCK_K)
    splits = min(steps, -(-TARGET_PROGRAMS // column_tiles))
    if splits <= 1:
        return in_features
    return SPLIT_BLOCK_K * -(-steps // splits)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_m: int = 16,
           split_k: bool | None = None, sums_ahead: bool = False) -> torch.Tensor | SplitSums:
    """x [rows, K] @ weight [N, K].T (+ bias [N]) -> [rows, N] in x's dtype, accumulated in float32; block_m: the
    row tile (16, tl.dot's smallest, for a few rows); split_k (None: as SPECD_FEW_ROW_GEMMS_SPLIT_K says, by default
    whole): K in splits (k_split) where the column tiles alone leave SMs idle, each split's sum
    in float32 and the splits added in order by a second kernel; with sums_ahead, a split GEMM leaves that to the
    kernel that reads its output, and returns its SplitSums (kernels/split_sums.py)."""
    rows, k = x.shape
    n = weight.shape[0]
    if rows == 0:
        return torch.empty(0, n, device=x.device, dtype=x.dtype)
    block_n, block_k, warps, stages = tiles(n, block_m)
    dependent = pdl.enabled(x.device)
    if split_k is None:
        setting = _split_k_setting()
        split_k = setting == "1" or (setting == "tile" and rows <= block_m)
    per_split = k_split(n, k, block_m) if split_k else k
    if per_split < k:
        return _split_linear(x, weight, bias, block_m, block_n, per_split, dependent, sums_ahead)
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n, block_n), triton.cdiv(rows, block_m))
    _linear_kernel[grid](x, weight, bias if bias is not None else weight, y, rows, n, k, x.stride(0), x.stride(1),
                         weight.stride(0), weight.stride(1), y.stride(0), HAS_BIAS=bias is not None,
                         IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                         PDL=dependent, num_warps=warps, num_stages=stages, launch_pdl=dependent)
    return y


@functools.cache
def _split_k_setting() -> str:
    """SPECD_FEW_ROW_GEMMS_SPLIT_K, read once per process: linear runs for every GEMM of an eager step."""
    return environment.few_row_gemms_split_k()


def _split_linear(x, weight, bias, block_m: int, block_n: int, per_split: int, dependent: bool,
                  sums_ahead: bool) -> torch.Tensor | SplitSums:
    rows, k = x.shape
    n = weight.shape[0]
    splits = triton.cdiv(k, per_split)
    part = torch.empty(splits, rows, n, device=x.device, dtype=torch.float32)
    _partial_kernel[(triton.cdiv(n, block_n), triton.cdiv(rows, block_m), splits)](
        x, weight, part, rows, n, k, per_split, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=SPLIT_BLOCK_K, PDL=dependent,
        num_warps=4, num_stages=2, launch_pdl=dependent)
    if sums_ahead:  # the kernel after it adds the parts: no output of its own
        return SplitSums(part, bias, x.dtype)
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    block = 256
    _sum_splits_kernel[(triton.cdiv(n, block), rows)](
        part, bias if bias is not None else weight, y, rows, n, y.stride(0), SPLITS=splits, HAS_BIAS=bias is not None,
        BLOCK=block, PDL=dependent, num_warps=4, launch_pdl=dependent)
    return y
