"""Tuning candidates timed in CUDA graphs (verifier_service/model/graph_timing.py): a launch's time is its
device time, without the host's launch path; a launch a graph cannot hold falls back to Inductor's timing; and
torch.compile tunes through it to a kernel that computes what eager code does."""
from __future__ import annotations

import pytest
import torch

from verifier_service.model.graph_timing import time_in_graph, timed_in_graphs

pytestmark = pytest.mark.gpu


def eager_ms(launch, repeats: int = 20) -> float:
    """Device ms of launch() back to back, CUDA events around all of them (no host gap between launches)."""
    launch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def test_a_launch_is_timed_as_the_device_runs_it():
    source = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # far beyond L2: cold either way
    target = torch.empty_like(source)
    with torch.cuda.stream(torch.cuda.Stream()):
        in_graph = time_in_graph(lambda: target.copy_(source))
    assert in_graph == pytest.approx(eager_ms(lambda: target.copy_(source)), rel=0.2)


def test_a_tiny_launch_is_not_timed_with_the_host_path():
    row = torch.ones(1024, device="cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        in_graph = time_in_graph(lambda: row.mul_(1.0))
    assert 0 < in_graph < 0.01  # a 4 KB multiply: ~2 us on the device


def test_a_launch_a_graph_cannot_hold_falls_back_to_inductors_timing():
    from torch._inductor.runtime.benchmarking import benchmarker

    row = torch.ones(1024, device="cuda")

    def from_host():  # a copy from pageable host memory: not allowed while a stream captures
        row.copy_(torch.ones(1024))

    with timed_in_graphs():
        ms = benchmarker.benchmark_gpu(from_host)
    assert 0 < ms < float("inf")
    assert "benchmark_gpu" not in vars(benchmarker)  # the patch is gone on leaving


def test_compiled_one_row_gemm_tunes_through_graph_timing_and_equals_eager():
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    timings = []
    bench = CachingAutotuner.bench

    def recorded_bench(autotuner, launcher, *args, **kwargs):
        with timed_in_graphs():
            timings.append(bench(autotuner, launcher, *args, **kwargs))
        return timings[-1]

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16) / 64
    compiled = torch.compile(lambda x, w: (x @ w.t()).float().relu(), dynamic=False, fullgraph=True,
                             mode="max-autotune-no-cudagraphs")
    CachingAutotuner.bench = recorded_bench
    try:
        torch._dynamo.reset()
        with torch._inductor.config.patch(autotune_local_cache=False):  # no tuned choice read from disk
            out = compiled(x, weight)
    finally:
        CachingAutotuner.bench = bench
    torch.testing.assert_close(out, (x @ weight.t()).float().relu(), rtol=2e-2, atol=2e-2)
    assert timings and all(ms > 0 for ms in timings)
    floor_ms = eager_ms(lambda: weight.clone()) / 2  # the clone reads and writes the 64 MB weight
    assert min(timings) < 2 * floor_ms  # the best candidate near its weight read, not a host's launch path
