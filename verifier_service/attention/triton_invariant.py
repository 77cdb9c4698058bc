"""Batch-invariant paged attention on CUDA for the deterministic mode: one Triton kernel for decode, verify and
prompt steps, whose output for a query token depends only on its query and its sequence's keys and values up to
its position.

Why the flash backend is not: it picks FA2's varlen or kvcache kernel, or our GQA-packed verify kernel, by the
step's shape, and splits a sequence's keys over as many programs as the batch leaves SMs free, so the same token is
summed in other blocks and orders at decode, at verify and beside other sequences (a near-tie argmax then flips
with speculation on).

Here one program covers (sequence, KV head, a tile of the sequence's query tokens): the GQA group's query heads x
up to BLOCK_M // group tokens, always a BLOCK_M-row tile. Keys go in blocks of BLOCK_N from position 0 up, never
split, with the online softmax in float32: every query row meets the same blocks in the same order, whatever
shares its tile or its step. Blocks past a row's position give it weights of exactly 0 and leave its running
maximum, sum and output exactly as they were, so a step that reaches further (a verify step's later tokens, a
longer prompt chunk) changes nothing for it.

KV cache layout: flash-attn's paged one, [num_blocks, block_size, kv_heads, head_dim], contiguous; head_dim a
power of two; block_size a multiple of BLOCK_N; half precision (model_runner.py's _check_deterministic holds the
runner to that). Importing this module needs triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.triton_kv_write import write_kv as triton_write_kv
from verifier_service.kernels.gemm_rows import empty_rows

LOG2E = 1.4426950408889634
BLOCK_N = 64


@triton.jit(do_not_specialize=["stride_bt", "stride_q"])
def _attention_kernel(Q, K, V, BT, CTX, CU_Q, OUT, qk_scale, stride_bt, stride_q,
                      H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
                      TOKENS: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Q [num_tokens, H, D] (token stride stride_q), OUT [num_tokens, H, D]; K, V [blocks, BS, KVH, D]; BT [B, max];
    # CTX [B] keys visible to the sequence's last query token; CU_Q [B + 1] its query tokens' range.
    # Row r of the tile is query head kvh * GROUP + r // TOKENS at the tile's token r % TOKENS.
    b, kvh, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(CU_Q + b)
    q_len = tl.load(CU_Q + b + 1) - q_start
    first = tile * TOKENS
    if first < q_len:
        ctx = tl.load(CTX + b)
        rows = tl.arange(0, BLOCK_M)
        group, token = rows // TOKENS, first + rows % TOKENS
        row_ok = (group < GROUP) & (token < q_len)
        d = tl.arange(0, D)
        q_offs = (q_start + token).to(tl.int64) * stride_q + (kvh * GROUP + group) * D
        q = tl.load(Q + q_offs[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        query_pos = ctx - q_len + token
        hi = tl.minimum(ctx, ctx - q_len + first + TOKENS)  # one past the tile's last visible key
        m_i = tl.full([BLOCK_M], -1e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        offs_n = tl.arange(0, BLOCK_N)
        for start in range(0, hi, BLOCK_N):  # BLOCK_N divides BS: a block of keys never crosses a page
            page = tl.load(BT + b * stride_bt + start // BS).to(tl.int64)
            n = start + offs_n
            kv = ((page * BS + n % BS) * KVH + kvh)[:, None] * D + d[None, :]
            n_ok = n < hi
            k = tl.load(K + kv, mask=n_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
            s = tl.where(n_ok[None, :] & (n[None, :] <= query_pos[:, None]) & row_ok[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + kv, mask=n_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out_rows = (q_start + token).to(tl.int64) * H + kvh * GROUP + group
        tl.store(OUT + out_rows[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


def tile_rows(group: int) -> int:
    """Rows of every tile: 64, or the GQA group rounded up to a power of two where that is more."""
    return max(64, triton.next_power_of_2(group))


def invariant_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        metadata: AttentionMetadata, scale: float) -> torch.Tensor:
    """query [num_tokens, heads, head_dim] (each sequence's tokens the last of its context) -> the same shape."""
    if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
        query = query.contiguous()  # heads of a token must be one row; the token stride may be anything
    num_tokens, heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    block_m = tile_rows(group)
    tokens = block_m // group
    out = empty_rows(query.shape, query)  # o_proj's input: room for its last GEMM's rows (kernels/gemm_rows.py)
    grid = (metadata.batch_size, kv_heads, triton.cdiv(metadata.max_seqlen_q, tokens))
    _attention_kernel[grid](query, k_cache, v_cache, metadata.block_tables, metadata.context_lens,
                            metadata.cu_seqlens_q, out, scale * LOG2E, metadata.block_tables.stride(0),
                            query.stride(0), H=heads, KVH=kv_heads, D=head_dim, GROUP=group, TOKENS=tokens,
                            BS=block_size, BLOCK_M=block_m, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    return out


class InvariantTritonBackend:
    """The deterministic mode's attention on CUDA: the flash backend's KV write, the kernel above for every step."""

    name = "invariant-triton"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 metadata: AttentionMetadata) -> None:
        triton_write_kv(key, value, k_cache, v_cache, metadata.slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        return invariant_attention(query, k_cache, v_cache, metadata, scale)

