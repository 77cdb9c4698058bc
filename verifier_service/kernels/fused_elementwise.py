"""RoPE and SiLU-and-multiply as one Triton kernel each, for the deterministic mode's uncompiled layers on CUDA.

Elementwise work is batch-invariant as it is; what these save is kernels. Eager PyTorch spends four on RoPE (roll,
two products, the sum) and two on SiLU-and-multiply, in every layer of every step: 180 of a step's ~450 launches on
the default model, where each costs about as much as its data. Both round once, from float32, where eager code
rounds after every op (the deterministic mode is consistent with itself, not bit-equal to the default mode).

Both can take a split GEMM's parts in place of their input (kernels/split_sums.py) and add them as they load it:
gate_up_proj's, and, in a model without QK-norm, the q/k/v projection's, whose v heads RoPE's kernel then writes
as they are. Both launch with programmatic dependent launch (kernels/pdl.py), as the mode's other kernels do.

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


@triton.jit(do_not_specialize=["tokens", "stride_token", "stride_head"])
def _rope_kernel(X, BIAS, COS, SIN, OUT, tokens, stride_token, stride_head, HEADS: tl.constexpr, ROTATED: tl.constexpr,
                 D: tl.constexpr, BLOCK_H: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PDL: tl.constexpr):
    # X [tokens, HEADS, D] by its strides (the last one 1), or with SPLITS a split GEMM's parts [SPLITS, tokens,
    # HEADS * D] and its BIAS (kernels/split_sums.py); COS, SIN [tokens, D] (SIN signed as rope.py's table); OUT
    # [tokens, HEADS, D] contiguous. The first ROTATED heads: out = x * cos + roll(x, D / 2) * sin; the rest: x.
    prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    h, d = tl.arange(0, BLOCK_H), tl.arange(0, D)
    ok = (h < HEADS)[:, None] & (d < D)[None, :]
    if SPLITS:  # the GEMM's output, as its own adding kernel would have written it
        cols = h[:, None] * D + d[None, :]
        rolled_cols = h[:, None] * D + ((d + D // 2) % D)[None, :]
        x = summed(X, BIAS, token, cols, ok, tokens, HEADS * D, SPLITS, HAS_BIAS).to(OUT.dtype.element_ty)
        rolled = summed(X, BIAS, token, rolled_cols, ok, tokens, HEADS * D, SPLITS, HAS_BIAS).to(OUT.dtype.element_ty)
    else:
        row = X + token * stride_token + h[:, None] * stride_head
        x = tl.load(row + d[None, :], mask=ok, other=0.0)
        rolled = tl.load(row + ((d + D // 2) % D)[None, :], mask=ok, other=0.0)
    x, rolled = x.to(tl.float32), rolled.to(tl.float32)
    cos = tl.load(COS + token * D + d).to(tl.float32)
    sin = tl.load(SIN + token * D + d).to(tl.float32)
    out = tl.where((h < ROTATED)[:, None], x * cos[None, :] + rolled * sin[None, :], x)
    tl.store(OUT + (token * HEADS + h[:, None]) * D + d[None, :], out.to(OUT.dtype.element_ty), mask=ok)


def rope(x: torch.Tensor | SplitSums, cos: torch.Tensor, sin: torch.Tensor, heads: int | None = None,
         rotated: int | None = None) -> torch.Tensor:
    """RotaryEmbedding.apply in one kernel: x [tokens, heads, head_dim] (last dimension contiguous), cos, sin
    [tokens, 1, head_dim] -> x rotated, contiguous. With `rotated`, only the first that many heads (q and k of a
    q/k/v projection; v as it is). x may be a split GEMM's SplitSums [tokens, heads * head_dim] (added here: the
    q/k/v projection hands its parts on), given `heads`."""
    head_dim = cos.shape[-1]
    if isinstance(x, SplitSums):  # the kernel reads the parts [splits, tokens, heads * head_dim] and adds them
        data, bias, splits, dtype = x.parts, x.bias, x.parts.shape[0], x.dtype
        tokens, strides = x.shape[0], (0, 0)
    else:
        x = x if x.stride(-1) == 1 else x.contiguous()
        data, bias, splits, dtype = x, None, 0, x.dtype
        (tokens, heads, _), strides = x.shape, x.stride()[:2]
    out = torch.empty(tokens, heads, head_dim, device=data.device, dtype=dtype)
    if tokens:
        dependent = pdl.enabled(data.device)
        _rope_kernel[(tokens,)](data, bias if bias is not None else data, cos.contiguous(), sin.contiguous(), out,
                                tokens, *strides, HEADS=heads, ROTATED=heads if rotated is None else rotated,
                                D=head_dim, BLOCK_H=triton.next_power_of_2(heads), SPLITS=splits,
                                HAS_BIAS=bias is not None, PDL=dependent, num_warps=4, launch_pdl=dependent)
    return out


@triton.jit(do_not_specialize=["tokens"])
def _silu_mul_kernel(GATE_UP, BIAS, OUT, tokens, SIZE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
                     HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    # GATE_UP [tokens, 2 * SIZE] contiguous (gate, then up), or with SPLITS a split GEMM's parts [SPLITS, tokens,
    # 2 * SIZE] and its BIAS (kernels/split_sums.py) -> OUT [tokens, SIZE] = silu(gate) * up.
    prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < SIZE
    if SPLITS:  # gate and up as the GEMM's own adding kernel would have written them
        gate = summed(GATE_UP, BIAS, token, cols, ok, tokens, 2 * SIZE, SPLITS, HAS_BIAS)
        up = summed(GATE_UP, BIAS, token, SIZE + cols, ok, tokens, 2 * SIZE, SPLITS, HAS_BIAS)
        gate = gate.to(OUT.dtype.element_ty).to(tl.float32)
        up = up.to(OUT.dtype.element_ty).to(tl.float32)
    else:
        gate = tl.load(GATE_UP + token * 2 * SIZE + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(GATE_UP + token * 2 * SIZE + SIZE + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + token * SIZE + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(OUT.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up: torch.Tensor | SplitSums) -> torch.Tensor:
    """gate_up [tokens, 2 * size], or a split GEMM's SplitSums of that shape (added here) -> silu(gate) * up
    [tokens, size] in one kernel."""
    if isinstance(gate_up, SplitSums):  # the kernel reads the parts [splits, tokens, 2 * size] and adds them
        data, bias, splits = gate_up.parts, gate_up.bias, gate_up.parts.shape[0]
    else:
        data, bias, splits = gate_up.contiguous(), None, 0
    tokens, size = gate_up.shape[0], gate_up.shape[1] // 2
    out = empty_rows((tokens, size), data, gate_up.dtype)  # the down projection's input: room for its last GEMM's rows
    if tokens:
        dependent = pdl.enabled(data.device)
        _silu_mul_kernel[(tokens, triton.cdiv(size, 1024))](
            data, bias if bias is not None else data, out, tokens, SIZE=size, BLOCK=1024, SPLITS=splits,
            HAS_BIAS=bias is not None, PDL=dependent, num_warps=4, launch_pdl=dependent)
    return out
