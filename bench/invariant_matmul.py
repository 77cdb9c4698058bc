"""The deterministic mode's linear (kernels/invariant_matmul.py) against cuBLAS, per weight shape and row count, for
a grid of tiles: what each weight shape's fixed tiles should be.

Usage: python -m bench.invariant_matmul [--rows 1 5 64 320] [--models smollm2 qwen3-8b]
Each timing replays a CUDA graph of 64 calls over 8 copies of the weight (more than the L2 cache holds, as a step
reads each layer's weights from HBM), per call.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from verifier_service.kernels.invariant_matmul import Tiles, linear, tiles_for

SHAPES = {"smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
          "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)]}
COPIES, CALLS = 8, 64


def timed(call) -> float:
    """Microseconds per call, replayed from a CUDA graph of CALLS calls."""
    for _ in range(2):
        call(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            call(i % COPIES)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / (5 * CALLS)


def candidates() -> list[Tiles]:
    grid = itertools.product((64,), (16, 32, 64, 128), (64, 128, 256), (4,), (4,))
    return [Tiles(m, n, k, stages, warps) for m, n, k, stages, warps in grid]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 64, 320])
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| weight | rows | cuBLAS us | current us | best us | best tiles (m, n, k, stages) | overall us | overall tiles |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        for n, k in SHAPES[model]:
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(COPIES)]
            totals: dict[Tiles, float] = {}
            rows_results = []
            for rows in args.rows:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                cublas = timed(lambda i: F.linear(x, weights[i]))
                current = timed(lambda i: linear(x, weights[i]))
                per_tiles = {}
                for tiles in candidates():
                    try:
                        per_tiles[tiles] = timed(lambda i, t=tiles: linear(x, weights[i], tiles=t))
                    except Exception:  # noqa: BLE001 - a tile the shape cannot take (shared memory)
                        continue
                    totals[tiles] = totals.get(tiles, 0.0) + per_tiles[tiles] / cublas
                best = min(per_tiles, key=per_tiles.get)
                rows_results.append((rows, cublas, current, per_tiles[best], best, per_tiles))
            overall = min(totals, key=totals.get)
            for rows, cublas, current, best_us, best, per_tiles in rows_results:
                print(f"| {n} x {k} | {rows} | {cublas:.1f} | {current:.1f} | {best_us:.1f} | "
                      f"{best.block_m}, {best.block_n}, {best.block_k}, {best.stages} | {per_tiles[overall]:.1f} | "
                      f"{overall.block_m}, {overall.block_n}, {overall.block_k}, {overall.stages} |")
            print(f"current rule for {n} x {k}: {tiles_for(n, k)}", flush=True)


if __name__ == "__main__":
    main()
