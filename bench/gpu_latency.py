"""Batch-1 step latency on the GPU: decode (1 token) and verify (1 + 4 drafts), graph replay and the whole
runner call (host packing + replay + logits to float), against the weight-read floor.

Usage: python -m bench.gpu_latency MODEL_DIR [MODEL_DIR ...] [--no-compile] [--both]
(checkpoints from `python -m bench.make_random_model`; --both measures each model without and with torch.compile).
The floor is weight bytes / measured device copy bandwidth (bytes read + written per second).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner

BLOCK, CONTEXT = 256, 512


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 20)."""
    src = torch.randn(2**29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * 4 / sorted(times[3:])[10]


def timed(fn, iters=200) -> float:
    """Median ms per call over `iters`, each call ended by a sync (as a step ends with its one D2H copy)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[iters // 2]


def measure(model_dir: str, bandwidth: float, compile_model: bool) -> dict:
    runner = ModelRunner(model_dir, device="cuda", dtype="bfloat16", block_size=BLOCK, kv_cache_bytes=1 << 30,
                         max_model_len=4096, compile_model=compile_model)
    runner.capture_cuda_graphs(1, [1, 5])
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    table = list(range(-(-(CONTEXT + 8) // BLOCK)))
    prompt = list(range(1, CONTEXT + 1))
    runner.execute(ScheduledBatch([ScheduledRequest("a", prompt, 0, table, 0, 1)]))
    row = {"model": Path(model_dir).name + (" compiled" if compile_model else " eager layers"), "weights_GB": weight_bytes / 1e9,
           "floor_ms": weight_bytes / bandwidth * 1e3}
    for name, width in (("decode", 1), ("verify_k4", 5)):
        batch = ScheduledBatch([ScheduledRequest("a", [5] * width, CONTEXT, table, width - 1, width)])
        shape = runner.graphs.shape_for(batch)
        graph, _ = runner.graphs._graphs[shape]
        runner.execute(batch)
        row[f"{name}_replay_ms"] = timed(graph.replay)
        row[f"{name}_step_ms"] = timed(lambda: runner.execute(batch).argmax(-1).tolist())
    del runner
    torch.cuda.empty_cache()
    return row


def main() -> None:
    bandwidth = copy_bandwidth()
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    modes = [False, True] if "--both" in sys.argv else ["--no-compile" not in sys.argv]
    rows = [measure(d, bandwidth, mode) for d in dirs for mode in modes]
    card = torch.cuda.get_device_name()
    print(json.dumps({"card": card, "copy_TBps": bandwidth / 1e12, "rows": rows}, indent=1))
    print(f"\n{card}, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write), batch 1, context {CONTEXT}")
    print("| model | weights GB | floor ms | decode replay ms | decode step ms | verify k=4 replay ms "
          "| verify k=4 step ms | verify step / floor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['weights_GB']:.2f} | {r['floor_ms']:.3f} | {r['decode_replay_ms']:.3f} | "
              f"{r['decode_step_ms']:.3f} | {r['verify_k4_replay_ms']:.3f} | {r['verify_k4_step_ms']:.3f} | "
              f"{r['verify_k4_step_ms'] / r['floor_ms']:.2f} |")


if __name__ == "__main__":
    main()
