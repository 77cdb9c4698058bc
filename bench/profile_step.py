"""Where the GPU's time goes: one engine step's kernels, a prompt's time to first token, and a run's device time
by kernel family (the one profiling tool; the probes it replaced are listed in docs/BENCHMARKS.md).

    python -m bench.profile_step MODEL_DIR [--no-compile]   # one batch-1 decode step x 20: the profiler's table
    python -m bench.profile_step MODEL_DIR --trace [--graph] [--deterministic] [--batch N]
    python -m bench.profile_step MODEL_DIR --prefill

Without options it prints the profiler's table of one decode step x 20, run without CUDA graphs. With --trace it
prints instead the ordered kernel names of ONE decode step and ONE verify step (k = 4), each with its duration,
so that every kernel of a layer can be attributed (norm, GEMM, QK-norm + RoPE, KV write, attention, ...),
then the kernels per layer of each step (the step's kernels minus those outside the layers, / layers).
With --graph the traced steps are replays of the captured CUDA graphs (batch 1, widths 1 and 5): the kernels
and durations of the graph itself, without the host-side copies of an eager step; with --deterministic, of the
deterministic mode's model (its linears, norms and attention, uncompiled); with --batch N, of N sequences at once
(each step's GPU time by kernel family follows its kernels). --prefill: where a prompt's
time to first token goes. `profiled_kernels` and `print_kernel_table` summarise any GPU run by kernel family
(bench/gpu_throughput.py --kernels).
"""
from __future__ import annotations

import re
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner

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


def trace(runner: ModelRunner, table: list[int], graphs: bool, size: int = 1) -> None:
    layers = len(runner.model.model.layers)
    for name, width in (("decode", 1), ("verify k=4", 5)):
        batch = ScheduledBatch([ScheduledRequest(f"r{i}", [5] * width, CONTEXT, table, width - 1, width)
                                for i in range(size)])
        kernels = replayed(runner, batch) if graphs else profiled(runner, batch, 1)[1]
        name += f", batch {size}" + (" (graph replay)" if graphs else "")
        print(f"\n== {name}: {len(kernels)} kernels in one step ({layers} layers) ==")
        for i, e in enumerate(kernels):
            print(f"{i:4d} {e.device_time:8.1f} us  {e.name[:150]}")
        # Kernels outside the layers (embedding, rotary lookup, final norm, LM head, sampling casts) are the
        # remainder of the count modulo the per-layer repetition.
        per_layer = len(kernels) // layers
        print(f"{name}: kernels per step {len(kernels)}, ~{per_layer} per layer "
              f"(+{len(kernels) - per_layer * layers} outside), GPU time {sum(e.device_time for e in kernels) / 1e3:.3f} ms")
        families = by_family((e.name, e.device_time) for e in kernels)
        print(f"{name}: us by family: " + ", ".join(f"{label} {us:.1f}" for label, us in families))


def prefill(model_dir: str) -> None:
    """Where a prompt's time to first token goes: prefills of several lengths through the runner (first call and
    repeats), the host's top operations of one, and the engine's add -> first output as the verifier runs it."""
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from verifier_service.runners import build_model_runner
    from specd.sampling import SamplingParams
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


# kernel name pattern -> family, first match wins (names differ between inductor, cuBLAS and flash-attn builds)
FAMILIES = [
    (r"flash_fwd_splitkv|flash_fwd_split|combine", "attention, decode (split-KV)"),
    (r"flash_fwd", "attention, prefill / verify"),
    (r"gemm|gemv|cutlass|sm90_xmma|nvjet|cublas|triton_tem", "GEMM"),
    (r"store_kvcache|reshape_and_cache|index_put|scatter", "KV cache write"),
    (r"exponential|argmax|softmax|sort|topk|cumsum|multinomial|race|keyed", "sampling"),
    (r"Memcpy|memcpy|Memset|memset", "copies"),
    (r"triton_|fused_", "fused elementwise (norms, rotary, SiLU, ...)"),
]


def kernel_family(name: str) -> str:
    for pattern, label in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def by_family(times) -> list[tuple[str, float]]:
    """(kernel name, time) pairs summed by kernel family, the largest first."""
    families: dict[str, float] = {}
    for name, time_spent in times:
        label = kernel_family(name)
        families[label] = families.get(label, 0.0) + time_spent
    return sorted(families.items(), key=lambda kv: -kv[1])


def profiled_kernels(fn, *args):
    """(fn's result, wall seconds, {kernel name: (calls, device seconds)}), CUDA activity only, so the host pays
    almost nothing; busy time against wall time shows how long the device waited for the host."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        started = time.perf_counter()
        result = fn(*args)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels = {e.key: (e.count, e.self_device_time_total / 1e6) for e in prof.key_averages()
               if e.self_device_time_total > 0}
    return result, wall, kernels


def print_kernel_table(title: str, wall: float, kernels: dict[str, tuple[int, float]], top: int = 30) -> None:
    """Device busy / wall, then device time by kernel family and the `top` kernels."""
    busy = sum(seconds for _, seconds in kernels.values())
    print(f"\n{title}: wall {wall:.2f} s, kernels {busy:.2f} s ({busy / wall:.0%} busy)")
    print("| family | device s | share |\n|---|---|---|")
    for label, seconds in by_family((name, seconds) for name, (_, seconds) in kernels.items()):
        print(f"| {label} | {seconds:.3f} | {seconds / busy:.1%} |")
    print("| kernel | calls | device s | share |\n|---|---|---|---|")
    for name, (calls, seconds) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {name[:90]} | {calls} | {seconds:.3f} | {seconds / busy:.1%} |")


def main() -> None:
    if "--prefill" in sys.argv:
        return prefill(sys.argv[1])
    runner = ModelRunner(sys.argv[1], device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                         max_model_len=4096, compile_model="--no-compile" not in sys.argv,
                         deterministic="--deterministic" in sys.argv)
    table = [0, 1, 2]
    runner.execute(ScheduledBatch([ScheduledRequest("a", list(range(1, CONTEXT + 1)), 0, table, 0, 1)]))
    if "--trace" in sys.argv:
        size = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 1
        if "--graph" in sys.argv:
            runner.capture_cuda_graphs(size, [1, 5])
        trace(runner, table, graphs="--graph" in sys.argv, size=size)
        return
    batch = ScheduledBatch([ScheduledRequest("a", [5], CONTEXT, table, 0, 1)])
    prof, kernels = profiled(runner, batch, 20)
    print(f"kernels per step: {len(kernels) / 20:.0f}, GPU time per step: "
          f"{sum(e.device_time for e in kernels) / 20 / 1e3:.3f} ms")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
