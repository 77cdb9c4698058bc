"""A sampled step's sampler on the GPU, from the model's bf16 logits to the tokens: the current path (the logits'
bf16 copy out of the CUDA graph's buffer, then one fused kernel that upcasts, divides by the temperature, races
and takes the greedy rows' argmax) against the path before it (a float32 copy, the division, a separate argmax
and the fused race on the scores), and the race as plain kernels.

Usage: python bench/gpu_sampler.py [--vocab 151936] [--rows 1,8,64,256]
Each case: median of 50 timed calls after 10 warm-up ones (CUDA events, gpu_latency.timed), ms. The fused and
plain kernels must pick the same tokens (checked on every case); the path before may differ from them where the
compiled division rounds differently from the eager one (counted).
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
    print(f"{torch.cuda.get_device_name()}, vocabulary {args.vocab}, T = 0.6; ms per call (median of {CALLS})")
    print("| rows | before: float copy, / T, argmax, race | now: bf16 copy, fused race | before / now "
          "| race, plain kernels | tokens differing before / now |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        buffer = (torch.randn(rows, args.vocab, device="cuda") * 4).bfloat16()  # the graph's output buffer
        keys = row_keys(torch.randint(-2**62, 2**62, (rows,)), torch.arange(rows)).cuda()
        temperature = torch.full((rows,), 0.6, device="cuda")
        greedy, ones = torch.zeros(rows, dtype=torch.bool, device="cuda"), torch.ones(rows, device="cuda")
        offsets = token_offsets(args.vocab, buffer.device)

        def before() -> torch.Tensor:
            logits = buffer.float()
            scores = logits / temperature.unsqueeze(1)
            return torch.where(greedy, logits.argmax(dim=-1), keyed_sample(scores, ones, keys, greedy))

        def now() -> torch.Tensor:
            return keyed_sample(buffer.clone(), temperature, keys, greedy)

        assert torch.equal(now(), _race(buffer, temperature, keys, greedy, offsets))
        differing = int((before() != now()).sum())
        then, fused = timed(before, CALLS), timed(now, CALLS)
        plain = timed(lambda: _race(buffer, temperature, keys, greedy, offsets), CALLS)
        print(f"| {rows} | {then:.3f} | {fused:.3f} | {then / fused:.2f}x | {plain:.3f} | {differing} / {rows} |")


if __name__ == "__main__":
    main()
