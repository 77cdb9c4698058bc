"""RMSNorm with one summation order per row, whatever the number of rows (the deterministic mode on CUDA).

PyTorch's reduction kernels choose how many threads and blocks share one row from the whole tensor's shape (a row
of 576 in a 1-row tensor is split over more threads than in a 64-row one), so a token's norm differs in the last
bits from one step to the next. Here one program reduces one row, always the same way: the residual add, the
float32 sum of squares, the scale, and the weight, with the roundings of RMSNorm's eager code (model/layers.py).

Importing this module needs triton (the deterministic mode on CUDA imports it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from verifier_service.kernels import pdl
from verifier_service.kernels.gemm_rows import empty_rows
from verifier_service.kernels.split_sums import SplitSums, summed
from verifier_service.kernels.triton_pdl import prologue


@triton.jit(do_not_specialize=["eps", "tokens", "stride_token", "stride_head", "stride_residual"])
def _rms_kernel(X, BIAS, RESIDUAL, WEIGHT, OUT, RESIDUAL_OUT, eps, tokens, stride_token, stride_head, stride_residual,
                HEADS: tl.constexpr, SIZE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, PDL: tl.constexpr):
    # X [tokens, HEADS, SIZE] by its strides (the last one 1), or with SPLITS a split GEMM's parts [SPLITS, tokens,
    # SIZE] (HEADS == 1) and its BIAS (kernels/split_sums.py); OUT [tokens, HEADS, SIZE] contiguous;
    # RESIDUAL [tokens, SIZE] (HEADS == 1) and RESIDUAL_OUT contiguous; WEIGHT [SIZE].
    prologue(PDL)
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < SIZE
    if SPLITS:  # the GEMM's output row, as its own adding kernel would have written it
        x = summed(X, BIAS, token, cols, ok, tokens, SIZE, SPLITS, HAS_BIAS).to(OUT.dtype.element_ty)
    else:
        x = tl.load(X + token * stride_token + head * stride_head + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # residual + x, rounded to the dtype as an eager add is
        x = (x.to(tl.float32) + tl.load(RESIDUAL + token * stride_residual + cols, mask=ok, other=0.0).to(tl.float32))
        x = x.to(OUT.dtype.element_ty)
        tl.store(RESIDUAL_OUT + token * SIZE + cols, x, mask=ok)
    h = x.to(tl.float32)
    scale = tl.rsqrt(tl.sum(h * h, 0) / SIZE + eps)
    y = (h * scale).to(OUT.dtype.element_ty)
    if HAS_WEIGHT:
        y = (y.to(tl.float32) * tl.load(WEIGHT + cols, mask=ok, other=0.0).to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + (token * HEADS + head) * SIZE + cols, y, mask=ok)


def rms_norm(x: torch.Tensor | SplitSums, eps: float, weight: torch.Tensor | None = None,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [tokens, size] or [tokens, heads, size] (last dimension contiguous), or a split GEMM's SplitSums [tokens,
    size] (added here) -> (x / rms(x) * weight, None); with residual [tokens, size]: (norm(residual + x),
    residual + x). Every row is reduced alone, in one order."""
    if isinstance(x, SplitSums):  # the kernel reads the parts [splits, tokens, size] and adds them
        view, bias, dtype, splits = x.parts, x.bias, x.dtype, x.parts.shape[0]
        (tokens, size), heads, strides = x.shape, 1, (0, 0)
    else:
        x = x if x.stride(-1) == 1 else x.contiguous()
        view, bias, dtype, splits = (x if x.dim() == 3 else x.unsqueeze(1)), None, x.dtype, 0
        (tokens, heads, size), strides = view.shape, view.stride()[:2]
    if residual is not None and (heads != 1 or residual.stride(-1) != 1):
        raise ValueError("residual: only for [tokens, size] inputs with a contiguous last dimension")
    out = empty_rows(x.shape, view, dtype)  # a linear's input: room for its last GEMM's rows
    residual_out = torch.empty_like(out) if residual is not None else None
    if tokens:
        dependent = pdl.enabled(view.device)
        _rms_kernel[(tokens, heads)](
            view, bias if bias is not None else view, residual if residual is not None else view,
            weight if weight is not None else view, out, residual_out if residual_out is not None else out, eps,
            tokens, *strides, residual.stride(0) if residual is not None else 0, HEADS=heads, SIZE=size,
            BLOCK=triton.next_power_of_2(size), SPLITS=splits, HAS_BIAS=bias is not None,
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, PDL=dependent,
            num_warps=4 if size > 1024 else 1, launch_pdl=dependent)
    return out, residual_out
