"""Verify-step attention against the KV-read floor (issue #6): paged FA2 (varlen and with_kvcache) and the
GQA-packed Triton kernel (verifier_service/attention/triton_verify.py), each checked against the reference
backend in float32, timed as CUDA-graph replays of 20 calls.

Usage: python bench/gpu_verify_attention.py [--batch 32] [--context 2048] [--query-len 5]
Shapes: 32 query heads, 8 KV heads, head dim 128, block size 256, bfloat16 (Llama-3-8B's attention).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.attention.metadata import AttentionMetadata  # noqa: E402
from verifier_service.attention.reference import ReferenceAttentionBackend  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 256
CALLS = 20


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device copy."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (start.elapsed_time(end) / 1000)


def replay_us(fn) -> float:
    """Microseconds per call of fn, from a CUDA graph of CALLS calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * CALLS)


def make_step(batch: int, context: int, query_len: int):
    blocks_per_seq = -(-context // BLOCK)
    num_blocks = batch * blocks_per_seq + 1
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks - 1)[:batch * blocks_per_seq].view(batch, blocks_per_seq) + 1
    slots = [int(tables[b, p // BLOCK]) * BLOCK + p % BLOCK for b in range(batch)
             for p in range(context - query_len, context)]
    metadata = AttentionMetadata.build([query_len] * batch, [context] * batch, tables.tolist(), slots, BLOCK, "cuda")
    query = torch.randn(batch * query_len, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return query, k_cache, v_cache, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--query-len", type=int, nargs="+", default=[5, 1])
    args = parser.parse_args()
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(f"{'kernel':<26} {'batch':>5} {'q tokens':>8} {'context':>7} {'us':>8} {'floor us':>8} "
          f"{'of floor':>8} {'max err':>8}")
    for query_len in args.query_len:
        query, k_cache, v_cache, md = make_step(args.batch, args.context, query_len)
        scale = HEAD_DIM ** -0.5
        floor_us = 2 * args.batch * args.context * KV_HEADS * HEAD_DIM * 2 / bandwidth * 1e6
        reference = ReferenceAttentionBackend().attend(query.float(), k_cache.float(), v_cache.float(), md, scale)
        kernels = {
            "FA2 varlen": lambda: flash_attn_varlen_func(
                query, k_cache, v_cache, cu_seqlens_q=md.cu_seqlens_q, cu_seqlens_k=md.cu_seqlens_k,
                max_seqlen_q=md.max_seqlen_q, max_seqlen_k=md.max_seqlen_k, softmax_scale=scale, causal=True,
                block_table=md.block_tables),
            "FA2 with_kvcache": lambda: flash_attn_with_kvcache(
                query.view(args.batch, query_len, HEADS, HEAD_DIM), k_cache, v_cache, cache_seqlens=md.context_lens,
                block_table=md.block_tables, softmax_scale=scale, causal=True).view(query.shape),
        }
        try:
            from verifier_service.attention.triton_verify import verify_attention

            for splits in (1, 2, 4, 8):
                kernels[f"Triton GQA-packed s={splits}"] = (
                    lambda s=splits: verify_attention(query, k_cache, v_cache, md.block_tables, md.context_lens,
                                                      scale, query_len, num_splits=s))
        except Exception as error:  # report and keep the FA2 rows
            print(f"Triton kernel unavailable: {error!r}")
        for name, fn in kernels.items():
            try:
                error = float((fn().float() - reference).abs().max())
                us = replay_us(fn)
            except Exception as failure:
                print(f"{name}: failed: {failure!r}"[:400])
                continue
            print(f"{name:<26} {args.batch:>5} {query_len:>8} {args.context:>7} {us:>8.1f} {floor_us:>8.1f} "
                  f"{floor_us / us:>7.0%} {error:>8.4f}")


if __name__ == "__main__":
    main()
