"""Where a batch-1 decode step's GPU time goes: kernels per step and the top kernels by CUDA time.

Usage: python bench/gpu_profile_step.py MODEL_DIR [--no-compile] [--trace [--graph]]
(prints the profiler's table of one decode step x 20, run without CUDA graphs). With --trace it prints
instead the ordered kernel names of ONE decode step and ONE verify step (k = 4), each with its duration,
so that every kernel of a layer can be attributed (norm, GEMM, QK-norm + RoPE, KV write, attention, ...),
then the kernels per layer of each step (the step's kernels minus those outside the layers, / layers).
With --graph the traced steps are replays of the captured CUDA graphs (batch 1, widths 1 and 5): the kernels
and durations of the graph itself, without the host-side copies of an eager step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest  # noqa: E402
from verifier_service.engine.model_runner import ModelRunner  # noqa: E402

CONTEXT = 512


def profiled(runner: ModelRunner, batch: ScheduledBatch, steps: int):
    """(profiler of `steps` eager executions of `batch` after 5 warm-up ones, their CUDA kernels in launch order)."""
    for _ in range(5):
        runner.execute(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.execute(batch)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return prof, sorted(kernels, key=lambda e: e.time_range.start)


def replayed(runner: ModelRunner, batch: ScheduledBatch) -> list:
    """CUDA kernels of one replay of the graph that runs `batch`, in launch order."""
    runner.execute(batch)  # fills the graph's static inputs
    graph, _ = runner.graphs._graphs[runner.graphs.shape_for(batch)]
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(kernels, key=lambda e: e.time_range.start)


def trace(runner: ModelRunner, table: list[int], graphs: bool) -> None:
    layers = len(runner.model.model.layers)
    for name, width in (("decode", 1), ("verify k=4", 5)):
        batch = ScheduledBatch([ScheduledRequest("a", [5] * width, CONTEXT, table, width - 1, width)])
        kernels = replayed(runner, batch) if graphs else profiled(runner, batch, 1)[1]
        name += " (graph replay)" if graphs else ""
        print(f"\n== {name}: {len(kernels)} kernels in one step ({layers} layers) ==")
        for i, e in enumerate(kernels):
            print(f"{i:4d} {e.device_time:8.1f} us  {e.name[:150]}")
        # Kernels outside the layers (embedding, rotary lookup, final norm, LM head, sampling casts) are the
        # remainder of the count modulo the per-layer repetition.
        per_layer = len(kernels) // layers
        print(f"{name}: kernels per step {len(kernels)}, ~{per_layer} per layer "
              f"(+{len(kernels) - per_layer * layers} outside), GPU time {sum(e.device_time for e in kernels) / 1e3:.3f} ms")


def prefill(model_dir: str) -> None:
    """Where a prompt's time to first token goes: prefills of several lengths through the runner (first call and
    repeats), the host's top operations of one, and the engine's add -> first output as the verifier runs it."""
    import time

    from torch.profiler import ProfilerActivity, profile

    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine, build_model_runner
    from verifier_service.engine.sampling_params import SamplingParams
    from verifier_service.engine.warm_up import warm_up

    cuda = torch.cuda.is_available()  # (the CPU only checks that this runs)
    config = EngineConfig(model=model_dir, device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
                          block_size=256 if cuda else 16, kv_cache_bytes=1 << 30, max_num_seqs=256,
                          max_num_batched_tokens=8192)
    runner = build_model_runner(config, drafts=True)
    engine = Engine(config, None, runner)
    warm_up(engine)
    for length in (199, 250, 257, 301, 250, 512, 137, 250, 293, 293, 330):
        prompt = [(7 * i + (length if length < 290 else 0)) % 4000 + 10 for i in range(length)]  # 293+ share blocks
        started = time.perf_counter()
        engine.add_request(f"p{length}-{started}", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        first = None
        while engine.has_unfinished_requests():
            outputs = engine.step()
            if first is None and any(o.new_token_ids for o in outputs):
                first = time.perf_counter() - started
        print(f"engine: {length}-token prompt, first token after {1000 * first:.1f} ms", flush=True)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    table = list(range(4 if cuda else 64))
    for length in (250, 251, 250):
        batch = ScheduledBatch([ScheduledRequest("x", list(range(1, length + 1)), 0, table, 0, 1)])
        sync()
        started = time.perf_counter()
        runner.execute(batch)
        host = time.perf_counter() - started
        sync()
        print(f"runner: {length}-token prefill, host {1000 * host:.1f} ms, done {1000 * (time.perf_counter() - started):.1f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.execute(ScheduledBatch([ScheduledRequest("x", list(range(1, 251)), 0, table, 0, 1)]))
        sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))


def main() -> None:
    if "--prefill" in sys.argv:
        return prefill(sys.argv[1])
    runner = ModelRunner(sys.argv[1], device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                         max_model_len=4096, compile_model="--no-compile" not in sys.argv)
    table = [0, 1, 2]
    runner.execute(ScheduledBatch([ScheduledRequest("a", list(range(1, CONTEXT + 1)), 0, table, 0, 1)]))
    if "--trace" in sys.argv:
        if "--graph" in sys.argv:
            runner.capture_cuda_graphs(1, [1, 5])
        trace(runner, table, graphs="--graph" in sys.argv)
        return
    batch = ScheduledBatch([ScheduledRequest("a", [5], CONTEXT, table, 0, 1)])
    prof, kernels = profiled(runner, batch, 20)
    print(f"kernels per step: {len(kernels) / 20:.0f}, GPU time per step: "
          f"{sum(e.device_time for e in kernels) / 20 / 1e3:.3f} ms")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
