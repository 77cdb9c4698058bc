"""Skinny GEMMs on the GPU: the batch-1 decode (1 row) and verify (k + 1 = 5 rows) projections of
Qwen3-0.6B and Llama-3-8B, per GEMM library choice, against the weight-read floor.

Usage: python bench/gpu_gemm.py
Each variant runs 20 back-to-back calls of one projection inside a CUDA graph (what a step replays),
rotating over enough copies of the weight (>= 128 MiB) that none is still in the 50 MB L2 cache, as
in a real step where every layer has its own weights; us = graph replay time / 20. The floor is
weight bytes / measured copy bandwidth (as in gpu_latency.py). "per step" sums one layer's projections
x layers + the LM head once.
Variants: cuBLAS (torch's default), cuBLASLt (torch.backends.cuda.preferred_blas_library), inductor
max-autotune of a static-shape F.linear (Triton templates and ATen compete per shape), and two ways to give
a few rows the one-row treatment inductor gives a GEMV (a mul + sum reduction, tuned by coordinate descent):
"rows as GEMVs" (each row its own F.linear, compiled together) and "mul + sum" (the broadcast product
summed over k, in float32).

Usage: python bench/gpu_gemm.py [--models qwen3-0.6b,llama3-8b] [--rows 1,5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

torch._dynamo.config.recompile_limit = 64  # one static graph per (shape, rows)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_latency import copy_bandwidth, timed  # noqa: E402

MODELS = {  # name: (layers, [(out, in) per layer], lm_head (out, in))
    "qwen3-0.6b": (28, [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)], (151936, 1024)),
    "llama3-8b": (32, [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)], (128256, 4096)),
}
CALLS = 20


def replay_us(fn, weights: list[torch.Tensor]) -> float:
    """fn(weight) on the next weight copy per call."""
    turn = iter(range(10**9))

    def call():
        return fn(weights[next(turn) % len(weights)])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    return timed(graph.replay, iters=30) * 1e3 / CALLS


def variants():
    def cublas(x, w):
        return lambda weight: F.linear(x, weight)

    def autotuned(x, w):
        compiled = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
        compiled(x, w)
        return lambda weight: compiled(x, weight)

    def compiled_as(fn):
        def make(x, w):
            compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            compiled(x, w)
            return lambda weight: compiled(x, weight)
        return make

    def rows_as_gemvs(x, weight):
        return torch.cat([F.linear(x[i:i + 1], weight) for i in range(x.shape[0])])

    def mul_sum(x, weight):
        return (x.float().unsqueeze(1) * weight.float().unsqueeze(0)).sum(-1).to(x.dtype)
    return {"cuBLAS": ("cublas", cublas), "cuBLASLt": ("cublaslt", cublas), "inductor autotune": ("cublas", autotuned),
            "rows as GEMVs": ("cublas", compiled_as(rows_as_gemvs)), "mul + sum": ("cublas", compiled_as(mul_sum))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rows", default="1,5")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    rows = []
    for model in args.models.split(","):
        layers, shapes, head = MODELS[model]
        for m in (int(r) for r in args.rows.split(",")):
            totals, floor = {}, 0.0
            for (n, k), count in [(s, layers) for s in shapes] + [(head, 1)]:
                copies = max(2, -(-(128 << 20) // (n * k * 2)))
                weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                shape_floor = n * k * 2 / bandwidth * 1e6
                floor += count * shape_floor
                for name, (library, make) in variants().items():
                    torch.backends.cuda.preferred_blas_library(library)
                    us = replay_us(make(x, weights[0]), weights)
                    print(f"{model} m={m} {n}x{k} {name}: {us:.1f} us (floor {shape_floor:.1f})", flush=True)
                    totals[name] = totals.get(name, 0.0) + count * us
                torch.backends.cuda.preferred_blas_library("cublas")
            rows.append((model, m, floor, totals))
    print(f"\n{'model':<12} {'rows':>4} {'floor us':>9} " + " ".join(f"{v:>18}" for v in variants()))
    for model, m, floor, totals in rows:
        print(f"{model:<12} {m:>4} {floor:>9.0f} " + " ".join(f"{totals[v]:>9.0f} ({totals[v] / floor:.2f}x)"
                                                           for v in variants()))


if __name__ == "__main__":
    main()
