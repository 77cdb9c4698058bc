"""The step's new keys and values into the paged cache in one Triton kernel (issue #6: one KV write per layer).

`index_copy_` on k_cache and then on v_cache is two kernels per layer; at batch-1 decode and verify each is
~2.3 us of a ~45 us layer on an H200, for a few KiB of data. Here one program per token copies that token's
key row and value row (num_kv_heads * head_dim elements each) to its slot. The flash backend writes every
step's keys and values with it; importing this module needs triton, so the backend imports it lazily and
keeps index_copy_ without it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from verifier_service.kernels import pdl
from verifier_service.kernels.triton_pdl import prologue


@triton.jit
def _write_kv_kernel(KEY, VALUE, K_CACHE, V_CACHE, SLOTS, stride_key, stride_value,
                     ROW: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # KEY, VALUE [num_tokens, ROW] with row strides stride_key / stride_value; caches [num_slots, ROW].
    prologue(PDL)
    token = tl.program_id(0)
    slot = tl.load(SLOTS + token).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < ROW
    key = tl.load(KEY + token.to(tl.int64) * stride_key + offs, mask=ok)
    value = tl.load(VALUE + token.to(tl.int64) * stride_value + offs, mask=ok)
    tl.store(K_CACHE + slot * ROW + offs, key, mask=ok)
    tl.store(V_CACHE + slot * ROW + offs, value, mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, kv_heads, head_dim] with each token's row contiguous (a column slice of the qkv output is)."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key, value [num_tokens, kv_heads, head_dim] -> caches [num_blocks, block_size, kv_heads, head_dim]
    (contiguous, key's dtype) at slot_mapping [num_tokens] (block * block_size + offset)."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key, value = _rows(key), _rows(value)
    row, dependent = key.shape[1] * key.shape[2], pdl.enabled(key.device)
    _write_kv_kernel[(num_tokens,)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
                                    ROW=row, BLOCK=triton.next_power_of_2(row), PDL=dependent, num_warps=4,
                                    launch_pdl=dependent)


def supports(key: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """CUDA tensors of one dtype and contiguous caches (the layout the kernel addresses by slot * row)."""
    return (key.is_cuda and k_cache.dtype == key.dtype == v_cache.dtype
            and k_cache.is_contiguous() and v_cache.is_contiguous())
