"""The sampled verify rows' cost on the GPU: the keyed exponential race eagerly (a dozen passes over a
[rows, vocab] int64 tensor) against the fused, compiled keyed_sample, next to the temperature division that
feeds both and the softmax the race no longer needs (it races logits / T in logs).

Usage: python bench/gpu_sampler.py [--vocab 151936] [--rows 1,8,64,256]
Each case: median of 50 timed calls after 10 warm-up ones (CUDA events, gpu_latency.timed), ms. Both
samplers must pick the same tokens (checked on every case).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]
from gpu_latency import timed  # noqa: E402

from verifier_service.engine.keyed_noise import _race, keyed_sample, row_keys, token_offsets  # noqa: E402

CALLS = 50


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", default="1,8,64,256")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, vocabulary {args.vocab}; ms per call (median of {CALLS})")
    print("| rows | logits / T (T = 0.6) | softmax of that (not run) | race, plain kernels | race, fused "
          "| plain / fused |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        logits = torch.randn(rows, args.vocab, device="cuda")
        keys = row_keys(torch.randint(-2**62, 2**62, (rows,)), torch.arange(rows)).cuda()
        scores = logits / 0.6
        offsets = token_offsets(args.vocab, scores.device)
        assert torch.equal(keyed_sample(scores, keys), _race(scores, keys, offsets))
        divide = timed(lambda: logits / 0.6, CALLS)
        softmax = timed(lambda: torch.softmax(scores, dim=-1), CALLS)
        plain = timed(lambda: _race(scores, keys, offsets), CALLS)
        fused = timed(lambda: keyed_sample(scores, keys), CALLS)
        print(f"| {rows} | {divide:.3f} | {softmax:.3f} | {plain:.3f} | {fused:.3f} | {plain / fused:.1f}x |")


if __name__ == "__main__":
    main()
