"""Batch-invariant paged attention on CUDA for the deterministic mode: the same Triton kernels for decode, verify and
prompt steps, whose output for a query token depends only on its query and its sequence's keys and values up to
its position.

Why the flash backend is not: it picks FA2's varlen or kvcache kernel, or our GQA-packed verify kernel, by the
step's shape, and splits a sequence's keys over as many programs as the batch leaves SMs free, so the same token is
summed in other blocks and orders at decode, at verify and beside other sequences (a near-tie argmax then flips
with speculation on).

Two kernels. The first splits each query row's keys (positions 0 .. its own) into runs of whole BLOCK_N-key blocks,
at least SPLIT_KEYS keys and at most SPLITS runs, fixed by the row's position alone, so that a decode step's few
rows of a long sequence still spread over several programs: one program covers (sequence, KV head, a tile of the
sequence's query tokens, one run), the tile being the GQA group's query heads x up to BLOCK_M // group tokens,
always a BLOCK_M-row tile. It walks the tile's blocks of that run in position order with the online softmax in
float32. A block outside a row's run (or past its position) gives that row weights of exactly 0 and leaves its
state exactly as it was, so every row meets its own blocks in the same order whatever shares its tile or its step.
A row of one run (up to SPLIT_KEYS keys: most prompt rows) writes its output there; a row of several writes each
run's maximum, sum and unnormalised output, which the second kernel merges in run order. So the runs, the order and
the sums of a token are the same at decode, at verify and in a prompt chunk, and short rows pay for no partials.

KV cache layout: flash-attn's paged one, [num_blocks, block_size, kv_heads, head_dim], contiguous; head_dim a
power of two; block_size a multiple of BLOCK_N; half precision (model_runner.py's _check_deterministic holds the
runner to that). Both kernels launch with programmatic dependent launch (kernels/pdl.py). Importing this module
needs triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.triton_kv_write import write_kv as triton_write_kv
from verifier_service.kernels import pdl
from verifier_service.kernels.gemm_rows import empty_rows
from verifier_service.kernels.triton_pdl import prologue

LOG2E = 1.4426950408889634
BLOCK_N = 64
SPLIT_KEYS = 256  # a row's keys split in runs of at least this many (fewer keys: one run, no partials)
SPLITS = 8  # at most this many runs a row (longer rows: longer runs, whole key blocks)


@triton.jit(do_not_specialize=["stride_bt", "stride_q"])
def _partials_kernel(Q, K, V, BT, CTX, CU_Q, M, L, ACC, OUT, RUNS, qk_scale, stride_bt, stride_q,
                     H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, TOKENS: tl.constexpr,
                     BS: tl.constexpr, SPLIT_KEYS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    # Q [num_tokens, H, D] (token stride stride_q); K, V [blocks, BS, KVH, D]; BT [B, max]; CTX [B] keys visible to
    # the sequence's last query token; CU_Q [B + 1] its query tokens' range. A row of one run writes its output to
    # OUT [num_tokens, H, D]; a row of several writes each run's running maximum, sum and unnormalised output to
    # M, L [num_tokens, H, SPLITS] and ACC [num_tokens, H, SPLITS, D] (float32), and its token's run count to
    # RUNS [num_tokens], for _combine_kernel. Row r of the tile is query head kvh * GROUP + r // TOKENS at token
    # r % TOKENS.
    prologue(PDL)
    b, kvh, program = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tile, split = program // SPLITS, program % SPLITS
    q_start = tl.load(CU_Q + b)
    q_len = tl.load(CU_Q + b + 1) - q_start
    first = tile * TOKENS
    if first < q_len:
        ctx = tl.load(CTX + b)
        rows = tl.arange(0, BLOCK_M)
        group, token = rows // TOKENS, first + rows % TOKENS
        row_ok = (group < GROUP) & (token < q_len)
        visible = ctx - q_len + token + 1  # the row's keys: positions 0 .. visible - 1
        # its runs, fixed by its own position alone: whole key blocks, at least SPLIT_KEYS keys, at most SPLITS runs
        split_len = tl.maximum(tl.cdiv(tl.cdiv(visible, SPLITS), BLOCK_N) * BLOCK_N, SPLIT_KEYS)
        runs = tl.cdiv(visible, split_len)
        row_lo = split * split_len
        row_hi = tl.minimum(row_lo + split_len, visible)
        mine_rows = row_ok & (row_lo < row_hi)
        if tl.max(mine_rows.to(tl.int32), 0) > 0:
            d = tl.arange(0, D)
            q_offs = (q_start + token).to(tl.int64) * stride_q + (kvh * GROUP + group) * D
            q = tl.load(Q + q_offs[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
            lo = tl.min(tl.where(mine_rows, row_lo, 1 << 30), 0)  # every run starts on a block edge
            hi = tl.max(tl.where(mine_rows, row_hi, 0), 0)
            m_i = tl.full([BLOCK_M], -1e30, tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            offs_n = tl.arange(0, BLOCK_N)
            for start in range(lo, hi, BLOCK_N):  # BLOCK_N divides BS: a block of keys never crosses a page
                page = tl.load(BT + b * stride_bt + start // BS).to(tl.int64)
                n = start + offs_n
                kv = ((page * BS + n % BS) * KVH + kvh)[:, None] * D + d[None, :]
                n_ok = n < hi
                k = tl.load(K + kv, mask=n_ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
                mine = (n[None, :] >= row_lo[:, None]) & (n[None, :] < row_hi[:, None]) & mine_rows[:, None]
                s = tl.where(mine, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.math.exp2(m_i - m_new)
                p = tl.math.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(V + kv, mask=n_ok[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            head_row = (q_start + token).to(tl.int64) * H + kvh * GROUP + group
            alone = mine_rows & (runs == 1)
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(OUT + head_row[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=alone[:, None])
            parted = mine_rows & (runs > 1)
            slot = head_row * SPLITS + split
            tl.store(M + slot, m_i, mask=parted)
            tl.store(L + slot, l_i, mask=parted)
            tl.store(ACC + slot[:, None] * D + d[None, :], acc, mask=parted[:, None])
            if split == 0:
                tl.store(RUNS + q_start + token, runs, mask=row_ok)


@triton.jit
def _combine_kernel(M, L, ACC, OUT, RUNS, H: tl.constexpr, HB: tl.constexpr, D: tl.constexpr,
                    SPLITS: tl.constexpr, PDL: tl.constexpr):
    # One token's heads: each row's runs merged in order -> OUT [num_tokens, H, D]. A token of one run was written
    # by _partials_kernel.
    prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    runs = tl.minimum(tl.load(RUNS + token), SPLITS)  # a token no tile covers (none should) stays in bounds
    if runs > 1:
        heads = tl.arange(0, HB)
        head_ok = heads < H
        d = tl.arange(0, D)
        row = token * H + heads
        m = tl.full([HB], -1e30, tl.float32)
        l = tl.zeros([HB], tl.float32)
        acc = tl.zeros([HB, D], tl.float32)
        for split in range(runs):
            slot = row * SPLITS + split
            m_s = tl.load(M + slot, mask=head_ok, other=-1e30)
            l_s = tl.load(L + slot, mask=head_ok, other=0.0)
            acc_s = tl.load(ACC + slot[:, None] * D + d[None, :], mask=head_ok[:, None], other=0.0)
            m_new = tl.maximum(m, m_s)
            alpha, beta = tl.math.exp2(m - m_new), tl.math.exp2(m_s - m_new)
            l = l * alpha + l_s * beta
            acc = acc * alpha[:, None] + acc_s * beta[:, None]
            m = m_new
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(OUT + row[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=head_ok[:, None])


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
    m, l = (torch.empty(num_tokens, heads, SPLITS, device=query.device, dtype=torch.float32) for _ in range(2))
    acc = torch.empty(num_tokens, heads, SPLITS, head_dim, device=query.device, dtype=torch.float32)
    runs = torch.empty(num_tokens, device=query.device, dtype=torch.int32)
    grid = (metadata.batch_size, kv_heads, triton.cdiv(metadata.max_seqlen_q, tokens) * SPLITS)
    dependent = pdl.enabled(query.device)
    _partials_kernel[grid](query, k_cache, v_cache, metadata.block_tables, metadata.context_lens,
                           metadata.cu_seqlens_q, m, l, acc, out, runs, scale * LOG2E,
                           metadata.block_tables.stride(0), query.stride(0), H=heads, KVH=kv_heads, D=head_dim,
                           GROUP=group, TOKENS=tokens, BS=block_size, SPLIT_KEYS=SPLIT_KEYS, SPLITS=SPLITS,
                           BLOCK_M=block_m, BLOCK_N=BLOCK_N, PDL=dependent, num_warps=4, num_stages=2,
                           launch_pdl=dependent)
    if num_tokens:
        _combine_kernel[(num_tokens,)](m, l, acc, out, runs, H=heads, HB=triton.next_power_of_2(heads), D=head_dim,
                                       SPLITS=SPLITS, PDL=dependent, num_warps=4, launch_pdl=dependent)
    return out


class InvariantTritonBackend:
    """The deterministic mode's attention on CUDA: the flash backend's KV write, the kernel above for every step."""

    name = "invariant-triton"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        triton_write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        return invariant_attention(query, k_cache, v_cache, metadata, scale)

