"""Start-up of a tensor-parallel verifier: checks, one process per rank 1..N-1, the process groups.

Rank 0 (the verifier process) checks that the model splits N ways and that N devices are there before
any process starts, spawns the other ranks (worker.py), and all of them join three process groups over a
TCPStore on loopback (all ranks live on one host):
- the default group, for the forward's collectives and the step feedback: NCCL on CUDA, gloo on the CPU;
- a gloo group for the step inputs rank 0 sends from its host (step_channel.py), with a timeout long
  enough for an idle verifier (the other ranks wait in it between requests);
- a gloo group in which the ranks agree on torch.compile's kernel timings (shared_tuning.py).
A one-element all-reduce on each of the first two checks them before anything heavy runs (a broken NCCL
set-up fails or hangs there, not in the middle of the model). Then every rank builds its runner the same way
(rank_start.py: engine/rank_runner.py with its shard: load, KV cache, compile, CUDA graph capture), in step,
because those contain collectives. Each phase is logged on every rank (diagnostics.py).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from verifier_service.engine.config import EngineConfig
from verifier_service.engine.model_runner import resolve_device
from verifier_service.parallel.diagnostics import register_stack_dump_signal
from verifier_service.parallel.rank_start import join_and_build, plan_shards
from verifier_service.parallel.runner import ParallelRunner
from verifier_service.parallel.supervisor import RankSupervisor, hang_timeout_s
from verifier_service.parallel.teardown import leave_process_groups
from verifier_service.parallel.worker import run_worker
from verifier_service.sharding import one_shot_all_reduce

logger = logging.getLogger(__name__)

def check_devices(device: torch.device, tensor_parallel_size: int) -> None:
    """One GPU per rank on CUDA; raises ValueError naming the option when there are fewer."""
    if device.type != "cuda":
        return
    visible = torch.cuda.device_count()
    if tensor_parallel_size > visible:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(f"tensor_parallel_size: {tensor_parallel_size} ranks need {tensor_parallel_size} GPUs, "
                         f"{visible} visible" + (f" (CUDA_VISIBLE_DEVICES={devices})" if devices is not None else ""))


def start_tensor_parallel(config: EngineConfig, drafts: bool = True,
                          on_failure: Callable[[str], None] | None = None) -> ParallelRunner:
    """Rank 0's runner, ranks 1..N-1 started and loaded (drafts: as runners.build_model_runner takes it);
    on_failure(reason) when one dies or hangs later."""
    size, device = config.tensor_parallel_size, resolve_device(config.device)
    check_devices(device, size)
    one_shot_all_reduce.all_reduce_mode()  # a bad SPECD_TENSOR_PARALLEL_ALL_REDUCE fails here, naming it
    shards = plan_shards(config)
    logger.info("tensor parallel over %d %s ranks: KV heads %s, query heads %s per rank", size, device.type,
                [s.kv_heads for s in shards], [s.q_heads for s in shards])
    threads = max(1, torch.get_num_threads() // size) if device.type == "cpu" else torch.get_num_threads()
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=run_worker, args=(config, drafts, rank, store.port, threads),
                             name=f"specd-rank-{rank}") for rank in range(1, size)]
    supervisor = RankSupervisor(workers, hang_timeout_s())
    if on_failure is not None:
        supervisor.add_failure_callback(on_failure)
    register_stack_dump_signal()
    for worker in workers:
        worker.start()
    atexit.register(supervisor.stop, 0.0)  # never leave ranks behind, whatever ends this process
    supervisor.start()
    try:
        torch.set_num_threads(threads)
        runner, channel = join_and_build(config, drafts, shards, 0, store, device)
    except BaseException:
        supervisor.stop(timeout_s=0.0)
        leave_process_groups(healthy=False)
        raise
    return ParallelRunner(runner, channel, supervisor)
