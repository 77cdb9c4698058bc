"""Verify-step attention in Triton (issue #6), used by the flash backend for uniform-width steps of >1 token, and
for decode steps of too few sequences to fill the GPU (flash.py says why).

A verify step feeds every sequence the same k + 1 query tokens (the last sampled token and k drafts),
which are the last k + 1 positions of its context. FA2 reads each key and value once per query head
(and pads the k + 1 rows to its 64/128-row tile), so at k = 4 it reaches ~28% of the KV-read floor.
Here one program per (sequence, KV head, KV split) packs the GQA group's query heads x the k + 1 tokens
into one tile (group * (k + 1) rows, padded to BLOCK_M >= 16), so every key and value is read once per
KV head: ~78% of the floor at batch 32, L = 2048, k = 4 on an H200 (docs/BENCHMARKS_ARCHIVE.md).

Online softmax in float32 (log2 units), causal within the step: the token at row t sits at position
context_len - query_len + t and sees keys [0, that position]. With num_splits > 1 each program covers one
slice of the context and writes a partial output and log-sum-exp; a small combine kernel merges them,
which fills the GPU when batch * kv_heads is small. Sequences with context_len 0 (none) give zeros.
KV cache layout: flash-attn's paged one, [num_blocks, block_size, kv_heads, head_dim], contiguous;
head_dim a power of two; block_size a multiple of block_n (a chunk of keys never crosses a page).
Importing this module needs triton; the flash backend imports it lazily and falls back to FA2 without it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from verifier_service.kernels import pdl
from verifier_service.kernels.triton_pdl import prologue

LOG2E = 1.4426950408889634
MAX_TILE_ROWS = 128  # group * query_len above this is a prefill chunk, not a verify step: FA2 handles it


@triton.jit
def _verify_kernel(Q, K, V, BT, CTX, OUT, O_PART, LSE_PART, qk_scale, stride_bt, stride_q,
                   H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, QLEN: tl.constexpr, GROUP: tl.constexpr,
                   BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   PDL: tl.constexpr):
    # Q [B * QLEN, H, D] with token stride stride_q (a column slice of the projection), OUT [B * QLEN, H, D];
    # K, V [blocks, BS, KVH, D]; BT [B, max_blocks]; CTX [B];
    # O_PART [B * KVH * NUM_SPLITS * BLOCK_M, D] f32, LSE_PART [B * KVH * NUM_SPLITS * BLOCK_M] f32 (splits only).
    # Row r of the tile is query head kvh * GROUP + r // QLEN at step token r % QLEN.
    prologue(PDL)
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(CTX + b)
    rows = tl.arange(0, BLOCK_M)
    group, token = rows // QLEN, rows % QLEN
    row_ok = rows < GROUP * QLEN
    d = tl.arange(0, D)
    q_rows = (b * QLEN + token) * H + kvh * GROUP + group
    q_offs = (b * QLEN + token) * stride_q + (kvh * GROUP + group) * D
    q = tl.load(Q + q_offs[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    query_pos = ctx - QLEN + token  # the step's tokens are the last QLEN of the context
    split_len = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, ctx)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):  # BLOCK_N divides BS: a chunk never crosses a page
        page = tl.load(BT + b * stride_bt + start // BS).to(tl.int64)
        n = start + offs_n
        kv = ((page * BS + n % BS) * KVH + kvh)[:, None] * D + d[None, :]
        n_ok = n < hi
        k = tl.load(K + kv, mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
        visible = n_ok[None, :] & (n[None, :] <= query_pos[:, None]) & row_ok[:, None]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv, mask=n_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if NUM_SPLITS == 1:
        tl.store(OUT + q_rows[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    else:
        base = ((b * KVH + kvh) * NUM_SPLITS + split) * BLOCK_M + rows
        tl.store(O_PART + base[:, None] * D + d[None, :], out)
        tl.store(LSE_PART + base, tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf")))


@triton.jit
def _combine_kernel(O_PART, LSE_PART, OUT, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
                    QLEN: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, NUM_SPLITS: tl.constexpr,
                    PDL: tl.constexpr):
    # Merges the NUM_SPLITS partial outputs of (sequence b, KV head kvh), weighted by exp2(lse - max lse).
    prologue(PDL)
    b, kvh = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    base = (b * KVH + kvh) * NUM_SPLITS
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        m = tl.maximum(m, tl.load(LSE_PART + (base + s) * BLOCK_M + rows))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    weight = tl.zeros([BLOCK_M], tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        w = tl.math.exp2(tl.load(LSE_PART + (base + s) * BLOCK_M + rows) - m)
        acc += w[:, None] * tl.load(O_PART + ((base + s) * BLOCK_M + rows)[:, None] * D + d[None, :])
        weight += w
    out = acc / tl.where(weight > 0, weight, 1.0)[:, None]
    group, token = rows // QLEN, rows % QLEN
    q_rows = (b * QLEN + token) * H + kvh * GROUP + group
    tl.store(OUT + q_rows[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=(rows < GROUP * QLEN)[:, None])


def verify_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, query_len: int, num_splits: int = 1,
                     block_n: int = 64) -> torch.Tensor:
    """query [batch * query_len, heads, head_dim] (each sequence's last query_len positions), caches
    [num_blocks, block_size, kv_heads, head_dim], block_tables [batch, max_blocks] int32, context_lens [batch]
    int32 -> [batch * query_len, heads, head_dim]; causal within the step."""
    if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
        query = query.contiguous()  # heads of a token must be one row; the token stride may be anything
    num_tokens, heads, head_dim = query.shape
    batch, (_, block_size, kv_heads, _) = num_tokens // query_len, k_cache.shape
    group = heads // kv_heads
    block_m = max(16, triton.next_power_of_2(group * query_len))
    out = torch.empty(query.shape, device=query.device, dtype=query.dtype)
    parts = lse = out  # unused when num_splits == 1
    if num_splits > 1:
        parts = torch.empty(batch * kv_heads * num_splits * block_m, head_dim, device=query.device, dtype=torch.float32)
        lse = torch.empty(batch * kv_heads * num_splits * block_m, device=query.device, dtype=torch.float32)
    dependent = pdl.enabled(query.device)
    _verify_kernel[(batch, kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, context_lens, out, parts, lse, scale * LOG2E, block_tables.stride(0),
        query.stride(0),
        H=heads, KVH=kv_heads, D=head_dim, QLEN=query_len, GROUP=group, BS=block_size, BLOCK_M=block_m,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, PDL=dependent, num_warps=4, num_stages=3, launch_pdl=dependent)
    if num_splits > 1:
        _combine_kernel[(batch, kv_heads)](parts, lse, out, H=heads, KVH=kv_heads, D=head_dim, QLEN=query_len,
                                           GROUP=group, BLOCK_M=block_m, NUM_SPLITS=num_splits, PDL=dependent,
                                           num_warps=4, launch_pdl=dependent)
    return out


def supports(query: torch.Tensor, k_cache: torch.Tensor, query_len: int, block_n: int = 64) -> bool:
    """Whether verify_attention handles this step: CUDA half precision, contiguous paged cache,
    head_dim a power of two, block_size a multiple of block_n, and 1 to MAX_TILE_ROWS / group query tokens per
    sequence (a decode or verify step; a uniform prefill chunk would make the tile too large)."""
    head_dim, block_size = k_cache.shape[-1], k_cache.shape[1]
    group = query.shape[1] // k_cache.shape[2]
    return (1 <= query_len and group * query_len <= MAX_TILE_ROWS
            and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
            and k_cache.dtype == query.dtype and k_cache.is_contiguous()
            and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and block_size % block_n == 0)


def choose_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """KV splits per (sequence, KV head): 1 once those programs fill the SMs, else a power of two up to 16.

    Depends only on shapes, never on context lengths, so a CUDA graph captures one fixed launch."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    splits = 1
    while splits < 16 and batch * kv_heads * splits * 2 <= sms:
        splits *= 2
    return splits
