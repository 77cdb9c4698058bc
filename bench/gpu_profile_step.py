"""Where a batch-1 decode step's GPU time goes: kernels per step and the top kernels by CUDA time.

Usage: python bench/gpu_profile_step.py MODEL_DIR [--no-compile]
(prints the profiler's table of one decode step x 20, run without CUDA graphs)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest  # noqa: E402
from verifier_service.engine.model_runner import ModelRunner  # noqa: E402


def main() -> None:
    runner = ModelRunner(sys.argv[1], device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                         max_model_len=4096, compile_model="--no-compile" not in sys.argv)
    table = [0, 1, 2]
    runner.execute(ScheduledBatch([ScheduledRequest("a", list(range(1, 513)), 0, table, 0, 1)]))
    batch = ScheduledBatch([ScheduledRequest("a", [5], 512, table, 0, 1)])
    for _ in range(5):
        runner.execute(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            runner.execute(batch)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"kernels per step: {len(kernels) / 20:.0f}, GPU time per step: "
          f"{sum(e.device_time for e in kernels) / 20 / 1e3:.3f} ms")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
