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
(engine.build_model_runner with its shard: load, KV cache, compile, CUDA graph capture), in step, because
those contain collectives. Each phase is logged on every rank (diagnostics.py).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from specd.default_model import resolve_model_path
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.model_runner import resolve_device
from verifier_service.model.config import load_model_config
from verifier_service.parallel import one_shot_all_reduce
from verifier_service.parallel.diagnostics import phase, register_stack_dump_signal
from verifier_service.parallel.runner import ParallelRunner
from verifier_service.parallel.shard import RankShard, plan_shard
from verifier_service.parallel.shared_tuning import in_lockstep, share_tuning
from verifier_service.parallel.step_channel import StepChannel
from verifier_service.parallel.supervisor import RankSupervisor, hang_timeout_s
from verifier_service.parallel.teardown import leave_process_groups

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = timedelta(days=365)  # ranks 1..N-1 wait for the next step this long (an idle verifier)
TUNING_TIMEOUT = timedelta(minutes=10)  # a rank waits this long for the others' timing (NCCL's own default)


def check_devices(device: torch.device, tensor_parallel_size: int) -> None:
    """One GPU per rank on CUDA; raises ValueError naming the option when there are fewer."""
    if device.type != "cuda":
        return
    visible = torch.cuda.device_count()
    if tensor_parallel_size > visible:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(f"tensor_parallel_size: {tensor_parallel_size} ranks need {tensor_parallel_size} GPUs, "
                         f"{visible} visible" + (f" (CUDA_VISIBLE_DEVICES={devices})" if devices is not None else ""))


def plan_shards(config: EngineConfig) -> list[RankShard]:
    """Every rank's shard of config's model; raises ValueError naming the field when it cannot be split."""
    model_config = load_model_config(resolve_model_path(config.model))
    return [plan_shard(model_config, config.tensor_parallel_size, rank)
            for rank in range(config.tensor_parallel_size)]


def start_tensor_parallel(config: EngineConfig, drafts: bool = True,
                          on_failure: Callable[[str], None] | None = None) -> ParallelRunner:
    """Rank 0's runner, ranks 1..N-1 started and loaded (drafts: as engine.build_model_runner takes it);
    on_failure(reason) when one dies or hangs later."""
    from verifier_service.parallel.worker import run_worker

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


def join_and_build(config: EngineConfig, drafts: bool, shards: list[RankShard], rank: int, store: dist.Store,
                   device: torch.device):
    """Every rank's start-up after its process exists (shards: plan_shards(config)): process groups, then its
    runner and channel."""
    from verifier_service.engine.engine import build_model_runner

    shard, alike = shards[rank], len({each.shape for each in shards}) == 1
    with phase(rank, f"joining the process groups ({shard.world_size} ranks, {device.type})"):
        host_group = join_process_groups(rank, shard.world_size, store, device, alike)
    with phase(rank, "loading the shard, KV cache, compiled regions and CUDA graph capture"), in_lockstep():
        runner = build_model_runner(config, drafts, shard=shard)
    logger.info("rank %d: %d KV blocks, CUDA graphs %s", rank, runner.num_blocks,
                "captured" if runner.graphs is not None else "off")
    return runner, StepChannel(host_group, runner.device)


def join_process_groups(rank: int, size: int, store: dist.Store, device: torch.device,
                        alike: bool = True) -> dist.ProcessGroup:
    """Joins the default group (NCCL on CUDA, gloo on the CPU) and the gloo group for step inputs (returned),
    each checked with a one-element all-reduce, and the group for kernel timings (shared_tuning.py; alike: whether
    the ranks' shards have the same shapes)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    if device.type == "cuda":
        torch.cuda.set_device(rank)  # rank r drives GPU r; "cuda" means it from here on
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=size, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    host_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    share_tuning(dist.new_group(backend="gloo", timeout=TUNING_TIMEOUT), device, alike)
    _check_all_reduce(None, device, size)  # NCCL's first collective, outside any CUDA graph capture
    _check_all_reduce(host_group, torch.device("cpu"), size)
    return host_group


def _check_all_reduce(group: dist.ProcessGroup | None, device: torch.device, size: int) -> None:
    """Sums a one from every rank of group (None: the default group) on device; raises unless it gives size."""
    ones = torch.ones(1, dtype=torch.int64, device=device)
    dist.all_reduce(ones, group=group)
    if (total := int(ones.item())) != size:
        raise RuntimeError(f"tensor parallelism: a check all-reduce of ones over {size} ranks gave {total}")
