"""Two real processes over gloo agree on kernel timings as tensor-parallel ranks do at start-up
(verifier_service/sharding/shared_tuning.py): in lockstep every rank gets the ranks' mean timing of a
candidate, outside it each keeps its own, ranks that time different candidates fail instead of pairing
unrelated numbers, and a rank that skipped a timing fails with its peers at the next checkpoint; a choice in
Inductor's on-disk cache is not reused in lockstep. Inductor's autotuner needs a GPU, so `bench` here is a
stand-in with its call shape."""
from __future__ import annotations

import multiprocessing
import os
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from verifier_service.sharding.shared_tuning import (agreeing, checkpoint, in_lockstep, share_tuning,
                                                      tune_through_lockstep)

CHECKPOINT = "checkpoint"
# (kernel, candidate config, this rank's timing in ms) per rank, in the order each rank tunes them
TIMINGS = {0: [("triton_red_fused_mul_sum_0", "XBLOCK: 1, R0_BLOCK: 2048", 0.031),
               ("triton_red_fused_mul_sum_0", "XBLOCK: 2, R0_BLOCK: 1024", 0.036)],
           1: [("triton_red_fused_mul_sum_0", "XBLOCK: 1, R0_BLOCK: 2048", 0.035),
               ("triton_red_fused_mul_sum_0", "XBLOCK: 2, R0_BLOCK: 1024", 0.029)]}


def tune(timings) -> list:
    """What Inductor's bench gives this rank: each candidate of timings once outside lockstep, then once in it (a
    CHECKPOINT entry: the engine's checkpoint before a graph capture instead, giving None)."""
    bench = agreeing(lambda autotuner, launcher, *args: launcher.ms)

    def run(kernel: str, config: str, ms: float | None) -> float | None:
        if kernel == CHECKPOINT:
            return checkpoint(config)
        return bench(SimpleNamespace(inductor_meta={"kernel_name": kernel}), SimpleNamespace(config=config, ms=ms),
                     torch.zeros(1))

    alone = [run(*timing) for timing in timings]
    with in_lockstep():
        try:
            together = [run(*timing) for timing in timings]
        except RuntimeError as error:
            together = str(error)
    return [alone, together]


def start_up(rank: int, store: dist.Store, timings, alike: bool = True) -> list | None:
    """One rank of one start-up: its process groups, its timing group shared, then tune(timings) unless None."""
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    share_tuning(dist.new_group(backend="gloo", timeout=timedelta(seconds=20)), torch.device("cpu"), alike)
    try:
        return None if timings is None else tune(timings)
    finally:
        dist.destroy_process_group()


def rank_1(port: int, timings, results, alike: bool) -> None:
    results.put(start_up(1, dist.TCPStore("127.0.0.1", port, 2, is_master=False), timings, alike))


def run_both(timings_of_rank_1, start_ups: int = 1, timings_of_rank_0=TIMINGS[0],
             alike: bool = True) -> tuple[list, list]:
    """Rank 0 here and rank 1 in a process of its own, start_ups times in turn (a new rank 1 each time, as a
    verifier's process that starts tensor parallelism again); the last start-up tunes. alike: as share_tuning
    takes it."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn = multiprocessing.get_context("spawn")
    for start in range(start_ups):
        last = start == start_ups - 1
        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        results = spawn.Queue()
        worker = spawn.Process(target=rank_1, args=(store.port, timings_of_rank_1 if last else None, results, alike))
        worker.start()
        try:
            mine = start_up(0, store, timings_of_rank_0 if last else None, alike)
            theirs = results.get(timeout=60)
        finally:
            worker.join(timeout=30)
        assert worker.exitcode == 0
    return mine, theirs


def test_ranks_take_the_mean_timing_in_lockstep_and_their_own_outside():
    (alone_0, together_0), (alone_1, together_1) = run_both(TIMINGS[1])
    assert alone_0 == [0.031, 0.036] and alone_1 == [0.035, 0.029]  # each alone would pick another candidate
    assert together_0 == together_1 == pytest.approx([0.033, 0.0325])  # both now pick the second


def test_ranks_timing_different_candidates_fail_naming_theirs():
    other_kernel = [("triton_per_fused_add_rms_norm_1", config, ms) for _, config, ms in TIMINGS[1]]
    (_, error_0), (_, error_1) = run_both(other_kernel)
    assert "out of step" in error_0 and "triton_red_fused_mul_sum_0" in error_0
    assert "out of step" in error_1 and "triton_per_fused_add_rms_norm_1" in error_1


def test_a_rank_that_skipped_a_tuning_fails_at_the_next_checkpoint_with_its_peers():
    """Rank 1 found its second candidate's choice made already and went on to capture a graph, while rank 0 times
    that candidate: both fail there, naming where each was, instead of waiting for each other."""
    skipped = [TIMINGS[1][0], (CHECKPOINT, "capture of the 1 x 1 graph", None)]
    (alone_0, error_0), (alone_1, error_1) = run_both(skipped)
    assert alone_1 == [0.035, None]  # outside lockstep a checkpoint is nothing
    assert "out of step" in error_0 and "XBLOCK: 2, R0_BLOCK: 1024" in error_0
    assert "out of step" in error_1 and "checkpoint: capture of the 1 x 1 graph" in error_1


def test_ranks_with_shards_of_different_shapes_tune_alone_and_share_checkpoints():
    """Heads that do not split evenly (the default model's 3 KV heads over 2 ranks) give the ranks different
    kernels, with different candidates: paired, rank 1 would move on to its next all-reduce while rank 0 waits in
    a timing (a hang on the GPU). Each keeps its own timings; the checkpoint still pairs them."""
    capture = (CHECKPOINT, "capture of the 1 x 1 graph", None)
    other_kernel = [("triton_per_fused_add_rms_norm_1", config, ms) for _, config, ms in TIMINGS[1][:1]]
    (_, alone_0), (_, alone_1) = run_both(other_kernel + [capture], timings_of_rank_0=TIMINGS[0] + [capture],
                                          alike=False)
    assert alone_0 == [0.031, 0.036, None] and alone_1 == [0.035, None]
    skipped = [(CHECKPOINT, "capture of the 2 x 1 graph", None)]
    (_, error_0), (_, error_1) = run_both(skipped, timings_of_rank_0=[capture], alike=False)
    assert "out of step" in error_0 and "out of step" in error_1


def inductor_settings_kept():
    """Inductor's settings that tune_through_lockstep changes for the whole process, restored after the test."""
    from torch._inductor import config

    return config.patch(compile_threads=config.compile_threads, shape_padding=config.shape_padding)


def test_ranks_pass_a_checkpoint_they_all_reach():
    capture = (CHECKPOINT, "capture of the 1 x 1 graph", None)
    (_, together_0), (_, together_1) = run_both(TIMINGS[1] + [capture], timings_of_rank_0=TIMINGS[0] + [capture])
    assert together_0 == together_1 == pytest.approx([0.033, 0.0325, None])


def test_a_later_start_up_agrees_over_its_own_group():  # e.g. a bench or test process that starts TP engines in turn
    (_, together_0), (_, together_1) = run_both(TIMINGS[1], start_ups=2)
    assert together_0 == together_1 == pytest.approx([0.033, 0.0325])


def test_a_choice_on_disk_is_not_reused_in_lockstep(tmp_path):
    """A kernel a TP 1 verifier tuned has its choice in Inductor's cache for rank 0 alone: in lockstep it reads as
    none (so rank 0 tunes the kernel as its peers do), outside lockstep as it was saved."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    with inductor_settings_kept():
        tune_through_lockstep()  # as share_tuning does on a CUDA rank (nothing off CUDA tunes through it)

    def candidates() -> list[SimpleNamespace]:  # fresh each read: Inductor marks the config it returns
        return [SimpleNamespace(kwargs={"XBLOCK": x, "R0_BLOCK": 4096 // x}, num_warps=4, num_stages=1)
                for x in (1, 2)]

    meta = {"autotune_local_cache": True}  # as a kernel compiled with Inductor's defaults has it in its source
    AutotuneCache.create(meta, str(tmp_path / "kernel.py"), "configs-hash").save(candidates()[1], 10_000_000)
    cache = AutotuneCache.create(meta, str(tmp_path / "kernel.py"), "configs-hash")
    assert cache.read_best(meta, candidates()).kwargs == {"XBLOCK": 2, "R0_BLOCK": 2048}
    with in_lockstep():
        assert cache.read_best(meta, candidates()) is None
    assert cache.read_best(meta, candidates()).kwargs == {"XBLOCK": 2, "R0_BLOCK": 2048}


def test_ranks_compile_where_the_patches_apply_and_time_nothing_while_compiling():
    """Inductor's compile workers would read a tuned choice from disk in their own processes, out of the patched
    read_best's reach, and only once their pool is up: a rank whose pool was up skipped what its peers tuned.
    Padding a GEMM is chosen by timing it while compiling: ranks chose differently, and compiled other kernels."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    with torch._inductor.config.patch(compile_threads=4, shape_padding=True):  # as on a many-core host
        assert get_compile_threads() == 4
        tune_through_lockstep()
        assert get_compile_threads() == 1 and not AsyncCompile.use_process_pool()
        assert not torch._inductor.config.shape_padding
