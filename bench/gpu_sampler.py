"""The sampled verify rows' cost on the GPU: the keyed exponential race eagerly (a dozen passes over a
[rows, vocab] int64 tensor) against the fused, compiled keyed_sample, next to the softmax that feeds both.

Usage: python bench/gpu_sampler.py [--vocab 151936] [--rows 1,8,64,256]
Each case: median of 50 timed calls after 5 warm-up ones (CUDA events), ms. Both samplers must pick the
same tokens (checked on every case).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.engine.keyed_noise import _race, keyed_sample, row_keys, token_offsets  # noqa: E402


def median_ms(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", default="1,8,64,256")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, vocabulary {args.vocab}; ms per call (median of 50)")
    print("| rows | softmax (T = 0.6) | race, plain kernels | race, fused | plain / fused |")
    print("|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        logits = torch.randn(rows, args.vocab, device="cuda")
        keys = row_keys(torch.randint(-2**62, 2**62, (rows,)), torch.arange(rows)).cuda()
        probs = torch.softmax(logits / 0.6, dim=-1)
        offsets = token_offsets(args.vocab, probs.device)
        assert torch.equal(keyed_sample(probs, keys), _race(probs, keys, offsets))
        softmax = median_ms(lambda: torch.softmax(logits / 0.6, dim=-1))
        plain = median_ms(lambda: _race(probs, keys, offsets))
        fused = median_ms(lambda: keyed_sample(probs, keys))
        print(f"| {rows} | {softmax:.3f} | {plain:.3f} | {fused:.3f} | {plain / fused:.1f}x |")


if __name__ == "__main__":
    main()
