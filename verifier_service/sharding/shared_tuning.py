"""Every rank of a tensor-parallel verifier picks the same tuned kernel configurations, and picks them well.

torch.compile tunes some kernels the first time they run (model/compile.py: one-row GEMMs as reductions under
coordinate descent, pointwise and reduction kernels with several candidate launch configurations): it times
each candidate on this process's GPU and keeps the fastest. Each rank did this on its own GPU, and chose
differently: 7 of a TP 2 decode step's 30 kernels differed on an H100 (docs/BENCHMARKS_ARCHIVE.md, round 14). Every
all-reduce then waits for the rank that drew the slower choice, so a step paid the slower of every pair: up to
0.15-0.28 ms a step.

Here, while the ranks run in lockstep (start-up, and the steps every rank executes), every timing Inductor
takes is the candidate timed in CUDA graphs (model/graph_timing.py: Inductor's own timing of a decode step's
small kernels measures the host's launch path more than the kernel, and differed by ~40% between the ranks),
then averaged over the ranks: one gloo all-gather per timing. Every rank then makes the same choices from the
same numbers. The ranks run the same forwards in the same order, so their timings pair up; each timing carries
a key (kernel name and candidate), and timings that do not match fail start-up (each rank names its own
candidate) instead of choosing from unrelated numbers. Code that runs on rank 0 alone (the sampler) tunes on
its own, outside lockstep, as a single-GPU verifier does.

Every rank must therefore tune exactly the kernels its peers tune. A rank that found a choice already made would
skip timings its peers wait in, and the ranks would hang (the peers in the gather, that rank in its first
all-reduce). Two places hold such choices, and in lockstep neither is used:
- Inductor's on-disk cache of tuned choices (`.best_config` files). A kernel a TP 1 verifier compiled on GPU 0
  has one there for rank 0 alone (the other ranks' kernels differ by device index), and switching the cache off
  does not reach it: that switch is baked into each kernel's source, which Inductor's FX graph cache returns as
  it was compiled (the switch is not part of the graph's cache key). So in lockstep reading a choice from it
  gives nothing. The compiled code itself stays cached; the tuning runs at every start (timed in graphs, it is
  faster than Inductor's own: start-up 90 s against 108-119, 2x H200). Inductor compiles kernels in a pool of
  worker processes once that pool is up, and a worker reads the cache in its own process, where this rule does
  not reach: rank 0 of a GPU test, whose pool was up from its TP 1 runner, took the choice a worker read while
  rank 1, its pool still starting, tuned (round 17). So in lockstep every rank compiles in its own process.
- this process's compiled kernels, tuned already when rank 0's process compiled them earlier (a TP 1 runner
  before the TP one, as the GPU tests do; the greedy verdict's kernel is the same at every
  TP size): share_tuning resets torch.compile's in-process state, so every rank starts as a new process does.
A choice Inductor times while it compiles is a rank's own too, and gives the ranks different kernels: at Llama-3-70B
shapes over 4 ranks, one rank padded a 5-row GEMM to 8 rows (pad_mm) and the others did not (round 17). That
choice is off on every rank.
Should anything else make a rank skip a tuning (a compile that fails on one rank, which cuda_graphs.py then runs
as plain kernels), the checkpoint before each CUDA graph capture fails start-up on every rank, naming where each
was, instead of leaving them waiting for each other.
"""
from __future__ import annotations

import contextlib
import logging
import zlib

import torch
import torch.distributed as dist

from verifier_service.model.graph_timing import timed_in_graphs

logger = logging.getLogger(__name__)

_group: dist.ProcessGroup | None = None  # the latest start-up's timing group (a process may start several in turn)
_alike = True  # whether its ranks' shards have the same shapes, so that their timings pair up


class _Lockstep:
    """A depth counter as a context manager: rank 0 enters it around every step, so it costs no generator."""
    depth = 0  # > 0 while this rank runs what every rank runs, in the same order

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1


_lockstep = _Lockstep()


def share_tuning(group: dist.ProcessGroup, device: torch.device, alike: bool) -> None:
    """From now on, timings taken in_lockstep are agreed over group's ranks (off CUDA nothing tunes, and
    Inductor is left alone). alike: whether every rank's shard has the same shapes. Ranks whose shards differ
    (heads that do not split evenly) compile different kernels, with different candidates, so no timing pairs
    up: each tunes its own, and only the checkpoints are shared."""
    global _group, _alike
    _group, _alike = group, alike
    if device.type != "cuda":
        return
    from torch._inductor.utils import clear_caches

    torch.compiler.reset()  # Dynamo's compiled code ...
    clear_caches()  # ... and Inductor's in-memory modules and kernels (tuned ones among them)
    tune_through_lockstep()


def tune_through_lockstep() -> None:
    """Patches Inductor once per process: while in lockstep, CachingAutotuner.bench times in graphs and agrees
    (agreeing) and AutotuneCache.read_best reads nothing (unread_in_lockstep); as before outside it. Kernels
    compile in this process, where those patches apply, never in Inductor's compile workers, and without the
    choice Inductor times while it compiles (padding a GEMM's rows)."""
    from torch._inductor import config
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    config.compile_threads = 1
    config.shape_padding = False  # pad_mm times a padded GEMM against the plain one while compiling
    if not getattr(CachingAutotuner.bench, "agreeing", False):
        CachingAutotuner.bench = agreeing(CachingAutotuner.bench, timed_in_graphs)
        AutotuneCache.read_best = unread_in_lockstep(AutotuneCache.read_best)


def _peers() -> dist.ProcessGroup | None:
    """The group to agree over: share_tuning's, while in lockstep; None otherwise."""
    return _group if _lockstep.depth else None


def in_lockstep() -> _Lockstep:
    """While inside, this rank runs the same compiled code as every other rank, in the same order."""
    return _lockstep


def agreeing(bench, timing=contextlib.nullcontext):
    """bench (CachingAutotuner.bench: autotuner, launcher, kernel args -> ms), run inside timing() and returning
    the mean of the ranks' timings of the same candidate (over share_tuning's group) while in lockstep; this
    rank's own, as Inductor takes it, otherwise."""
    def agreed_bench(autotuner, launcher, *args, **kwargs) -> float:
        if (group := _peers()) is None or not _alike:
            return bench(autotuner, launcher, *args, **kwargs)
        with timing():
            ms = bench(autotuner, launcher, *args, **kwargs)
        kernel = autotuner.inductor_meta.get("kernel_name") or autotuner.fn.__name__
        return agree_on_timing(group, f"{kernel} {launcher.config}", ms)
    agreed_bench.agreeing = True
    return agreed_bench


def unread_in_lockstep(read_best):
    """read_best (AutotuneCache.read_best: a kernel's tuned choice from Inductor's cache, or None) giving None while
    in lockstep, so that every rank tunes the kernel; as it was otherwise."""
    def read_best_outside_lockstep(cache, *args, **kwargs):
        return None if _lockstep.depth else read_best(cache, *args, **kwargs)
    return read_best_outside_lockstep


def checkpoint(where: str) -> None:
    """In lockstep: raises RuntimeError on every rank unless all reached `where` with no timing pending. A rank
    that skipped a tuning its peers are in (the two places above, or a compile that failed on it alone) would
    otherwise wait at its next all-reduce for peers that wait for it. Call before what blocks on the device."""
    if (group := _peers()) is not None:
        agree_on_timing(group, f"checkpoint: {where}", 0.0)


def agree_on_timing(group: dist.ProcessGroup, candidate: str, ms: float) -> float:
    """The mean of every rank's ms for candidate (each rank names its own); raises RuntimeError when the ranks
    are at different candidates (or checkpoints)."""
    key = float(zlib.crc32(candidate.encode()))  # exact in float64
    gathered = [torch.empty(2, dtype=torch.float64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, torch.tensor([key, ms], dtype=torch.float64), group=group)
    if any(timing[0].item() != key for timing in gathered):
        raise RuntimeError(f"tensor parallelism: the ranks' kernel tuning went out of step; this rank was at "
                           f"{candidate!r} (keys {[int(timing[0].item()) for timing in gathered]})")
    agreed = sum(timing[1].item() for timing in gathered) / len(gathered)
    logger.debug("%s: %.4f ms (ranks %s)", candidate, agreed, [timing[1].item() for timing in gathered])
    return agreed
