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

Memory: oneDNN (and PyTorch's ideep layer above it) cache one JIT-compiled primitive per input shape,
~0.6 MB each, so a server that saw every row count from 1 to 8192 would hold gigabytes. Inputs are
therefore padded to a few row counts (`padded_rows`: exact up to 16, then 1.33-1.5x steps up to 256)
and larger inputs run in chunks of 256 rows (per-row cost is flat beyond ~64 rows on these CPUs): at
most 24 shapes per weight shape, ~70 MB for the default model, all built when the weights are packed
(`prepack_linears` runs each weight shape once per row count), so serving never grows them.
"""
from __future__ import annotations


import torch
from torch import nn

from specd import environment

_DTYPES = (torch.float32, torch.bfloat16)
CHUNK_ROWS = 256  # inputs with more rows run in chunks of this many
_EXACT_ROWS = 16  # row counts up to this get a primitive each (decode and verify steps of small batches)


def padded_rows(rows: int) -> int:
    """The row count an input of `rows` (<= CHUNK_ROWS) is padded to: rows up to 16, then the next of
    24, 32, 48, 64, 96, 128, 192, 256 (at most 1.5x the rows)."""
    if rows <= _EXACT_ROWS:
        return rows
    size = _EXACT_ROWS
    while size < rows:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 16, 24, 32, 48, 64 ...
    return size


def onednn_linear_enabled(device: torch.device, dtype: torch.dtype, upcast: bool = False) -> bool:
    """Whether prepack_linears applies: CPU, float32 / bfloat16, oneDNN built in, not switched off; bfloat16 only
    where the CPU has oneDNN's bfloat16 instructions (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: without them oneDNN refuses
    to reorder a bfloat16 weight, and nn.Linear stays), or anywhere with `upcast`, PrepackedLinear then computing
    a bfloat16 layer in float32 (the deterministic mode, whose fixed-row linears must exist on every CPU)."""
    return (device.type == "cpu" and dtype in _DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and (dtype != torch.bfloat16 or upcast or _bfloat16_instructions())
            and environment.onednn_linear())


def _bfloat16_instructions() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _bfloat16_dot_products() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX). With AVX-512 alone oneDNN takes bfloat16
    weights but emulates the products: a 16-row GEMM of the default model's shapes then takes 2.6-3x its float32
    packing's time (docs/BENCHMARKS.md round 49)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def _packs_in_float32(fixed_rows: int | None) -> bool:
    """Whether a bfloat16 linear is packed in float32: where oneDNN cannot take bfloat16 weights, and for fixed-row
    linears (every step a 16-row GEMM: compute, not the weights' bytes, is their cost) where it would emulate them."""
    return not _bfloat16_instructions() or (fixed_rows is not None and not _bfloat16_dot_products())


class PrepackedLinear(nn.Module):
    """y = x W^T + b, with W held only in oneDNN's reordered layout (no dense copy kept).

    With `fixed_rows`, every input runs in chunks of exactly that many rows (the last one padded with zeros): one
    primitive computes every row, so a row's result does not depend on how many rows came with it (the
    deterministic mode; a 5-row and a 1-row primitive sum a 1536-long row in different orders). `bias` False
    leaves the linear's bias out (a row-parallel layer adds it after the sum over the ranks).

    A bfloat16 linear on a CPU without oneDNN's bfloat16 instructions, or with `fixed_rows` on one that would emulate
    them (_packs_in_float32), is packed in float32: its inputs are upcast and its outputs rounded back to bfloat16 (as
    a bfloat16 GEMM accumulates in float32 too)."""

    def __init__(self, linear: nn.Linear, fixed_rows: int | None = None, bias: bool = True):
        super().__init__()
        self.fixed_rows = fixed_rows
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, bias_values = linear.weight.detach(), linear.bias if bias else None
        self.out_dtype = weight.dtype
        if weight.dtype == torch.bfloat16 and _packs_in_float32(fixed_rows):
            weight = weight.float()
            bias_values = None if bias_values is None else bias_values.detach().float()
        self.bias = bias_values
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, in_features] -> [num_tokens, out_features]."""
        chunk = self.fixed_rows or CHUNK_ROWS
        if x.shape[0] <= chunk:
            return self._padded(x)
        return torch.cat([self._padded(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)])

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        size = self.fixed_rows or padded_rows(rows)
        if size != rows:  # extra zero rows: the same primitive serves every row count of the bucket
            x = torch.cat([x, x.new_zeros(size - rows, x.shape[1])])
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.packed_weight.dtype), self.packed_weight, self.bias, "none",
                                               [], "").to(self.out_dtype)
        return y if size == rows else y[:rows]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepack_linears(model: nn.Module, fixed_rows: int | None = None) -> None:
    """Replaces every nn.Linear in model by a PrepackedLinear (in place) and builds its oneDNN primitives.

    A tied LM head gets its own packed copy; the embedding keeps the dense matrix it looks rows up in.
    `fixed_rows`: see PrepackedLinear.
    """
    replaced: list[PrepackedLinear] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                replaced.append(PrepackedLinear(child, fixed_rows))
                setattr(parent, name, replaced[-1])
    _build_primitives(replaced)


@torch.inference_mode()
def _build_primitives(linears: list[PrepackedLinear]) -> None:
    """Runs one linear of each weight shape at every padded row count (oneDNN caches by shape, not data)."""
    fixed = {linear.fixed_rows for linear in linears} - {None}
    sizes = sorted(fixed or {padded_rows(rows) for rows in range(1, CHUNK_ROWS + 1)})
    seen = set()
    for linear in linears:
        key = (linear.in_features, linear.out_features, linear.bias is not None, linear.packed_weight.dtype)
        if key not in seen:
            seen.add(key)
            for rows in sizes:
                linear(torch.zeros(rows, linear.in_features, dtype=linear.packed_weight.dtype))
