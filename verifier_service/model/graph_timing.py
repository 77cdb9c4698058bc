"""Times torch.compile's tuning candidates as a step runs them: replayed from a CUDA graph, weights cold.

Inductor tunes a kernel by timing each candidate launch configuration from Python, with CUDA events around
every launch (CachingAutotuner.bench). A decode step's kernels run for 1-30 us, less than that launch path
(clones of the arguments the kernel writes, the launcher's Python) takes on a host that is compiling at the
same time: the GPU waits for the host inside the timed span. On 2x H200 (docs/BENCHMARKS_ARCHIVE.md, round 15) the
candidates of a TP 2 o_proj timed 18-57 us for a kernel that runs 5.9 us in the step, and one candidate 20 us
on one rank against 35 on the other; the down projection's pick ran 27.6 us in the step in one start-up and 13.9
in another. The choice was noise.

Inside `timed_in_graphs()`, Inductor's benchmarker instead captures the candidate's launch (Inductor's own
closure: the clones, the launch) REPEATS times into a CUDA graph, each after a write of twice the L2 cache, so
its weights come from memory as in a step that reads every layer's weights once; a second graph holds the
writes alone. The candidate's time is the difference of the two graphs' best replays over REPEATS. A launch a
graph cannot hold falls back to Inductor's own timing. Timed so, the two ranks' timings of a candidate differ by
0.5-5% (median by kernel), and a start-up's tuning takes less time than Inductor's own.

Used by tensor-parallel ranks (sharding/shared_tuning.py); a single-GPU verifier still tunes with Inductor's timing.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator

import torch

logger = logging.getLogger(__name__)

REPEATS = 8  # launches per graph: the replay's own launch cost, divided among them
REPLAYS = 5  # replays of each graph; the fastest counts


@contextlib.contextmanager
def timed_in_graphs() -> Iterator[None]:
    """While inside, CachingAutotuner.bench times its candidate in CUDA graphs (on a side stream, since a
    capture cannot run on the default one; the launcher takes the stream that is current when bench starts)."""
    from torch._inductor.runtime.benchmarking import benchmarker

    torch.cuda.synchronize()
    patched = {name: _graph_timed(getattr(benchmarker, name)) for name in ("benchmark", "benchmark_gpu")}
    try:
        with torch.cuda.stream(_side_stream(torch.cuda.current_device())):
            vars(benchmarker).update(patched)
            yield
    finally:
        for name in patched:
            vars(benchmarker).pop(name, None)
        torch.cuda.synchronize()


@functools.cache
def _side_stream(device: int) -> torch.cuda.Stream:
    """The one stream every timing on device runs on: the caching allocator keeps a stream's freed blocks for that
    stream alone, so one stream reuses one set of eviction buffers and clones for every candidate."""
    return torch.cuda.Stream(device)


def _graph_timed(timing: Callable[..., float]) -> Callable[..., float]:
    """timing (Benchmarker.benchmark / benchmark_gpu: a callable first, or as fn=), through CUDA graphs where
    the callable takes no arguments and can be captured."""
    def graph_timed(*args, **kwargs) -> float:
        launch = kwargs.get("fn", args[0] if args else None)
        if not callable(launch) or kwargs.get("fn_args") or kwargs.get("fn_kwargs") or len(args) > 1:
            return timing(*args, **kwargs)
        try:
            return time_in_graph(launch)
        except Exception as error:  # noqa: BLE001 - e.g. a launch that copies from the host: Inductor's timing
            logger.debug("tuning candidate not timed in a CUDA graph (%s): Inductor's own timing", error)
            return timing(*args, **kwargs)
    return graph_timed


def time_in_graph(launch: Callable[[], object]) -> float:
    """ms of one launch() from a CUDA graph, after writes that evict the L2 cache; raises where the launch cannot
    be captured. Runs on the current stream, which must not be the default one."""
    launch()  # loads the kernel, and raises for a configuration that cannot launch, before any capture
    torch.cuda.current_stream().synchronize()
    device = torch.cuda.current_device()
    evict = torch.empty(2 * torch.cuda.get_device_properties(device).L2_cache_size // 4, dtype=torch.int32,
                        device=device)
    with_launches = _captured(lambda: (evict.zero_(), launch()))
    writes_alone = _captured(evict.zero_)
    return max(_best_replay_ms(with_launches) - _best_replay_ms(writes_alone), 0.0) / REPEATS


def _captured(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A graph of body() REPEATS times, captured on the current stream (without torch.cuda.graph's collection
    of Python garbage at every capture: a start-up times hundreds of candidates)."""
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(capture_error_mode="thread_local")
    try:
        for _ in range(REPEATS):
            body()
    finally:
        graph.capture_end()
    return graph


def _best_replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.current_stream().synchronize()
    return min(start.elapsed_time(end) for start, end in events)
