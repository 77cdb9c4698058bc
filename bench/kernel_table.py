"""Where a GPU run's device time goes: run a function under torch's profiler (CUDA activity only, so the host
pays almost nothing) and summarise its kernels - busy time against wall time (the rest is the device idle,
waiting for the host) and the kernels that took most of it, grouped by family. Used by gpu_throughput.py
--kernels and nano_kernels.py, so specd's table and nano-vllm's come from the same code."""
from __future__ import annotations

import re
import time

import torch

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


def family(name: str) -> str:
    for pattern, label in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def profiled(fn, *args):
    """(fn's result, wall seconds, {kernel name: (calls, device seconds)})."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        started = time.perf_counter()
        result = fn(*args)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels = {e.key: (e.count, e.self_device_time_total / 1e6) for e in prof.key_averages()
               if e.self_device_time_total > 0}
    return result, wall, kernels


def print_table(title: str, wall: float, kernels: dict[str, tuple[int, float]], top: int = 30) -> None:
    busy = sum(seconds for _, seconds in kernels.values())
    print(f"\n{title}: wall {wall:.2f} s, kernels {busy:.2f} s ({busy / wall:.0%} busy)")
    families: dict[str, float] = {}
    for name, (_, seconds) in kernels.items():
        families[family(name)] = families.get(family(name), 0.0) + seconds
    print("| family | device s | share |\n|---|---|---|")
    for label, seconds in sorted(families.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {seconds:.3f} | {seconds / busy:.1%} |")
    print("| kernel | calls | device s | share |\n|---|---|---|---|")
    for name, (calls, seconds) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {name[:90]} | {calls} | {seconds:.3f} | {seconds / busy:.1%} |")
