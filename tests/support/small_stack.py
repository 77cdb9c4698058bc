"""A stack whose verifier has a deliberately tiny KV cache and a short queue (the reliability tests').

KV_BLOCKS blocks of 16 tokens hold only a few requests at once, so ordinary concurrency already
forces preemption; the verifier's context shrinks to what the cache holds (CONTEXT tokens).
"""
from __future__ import annotations

from bench.local_stack import Stack

# 2 (K and V) * 30 layers * 3 KV heads * 64 dims * 16 tokens * 4 bytes (float32): the default model's block.
KV_BLOCK_BYTES = 2 * 30 * 3 * 64 * 16 * 4
KV_BLOCKS = 24
CONTEXT = KV_BLOCKS * 16
MAX_WAITING_REQUESTS = 24
VOCAB_SIZE = 49152


def small_stack(*extra: str) -> Stack:
    """Not started yet: one such verifier and a gateway, no drafter; `extra` goes to every service."""
    return Stack(num_verifiers=1, with_drafter=False, extra_args=(
        "--device", "cpu", "--dtype", "float32", "--kv-cache-bytes", str(KV_BLOCKS * KV_BLOCK_BYTES),
        "--max-waiting-requests", str(MAX_WAITING_REQUESTS), *extra))
