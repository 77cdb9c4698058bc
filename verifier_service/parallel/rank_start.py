"""Every rank's start-up once its process exists (launch.py starts them): its shard, the process groups, then its
runner and step channel.

All ranks join three process groups over a TCPStore on loopback (all ranks live on one host); see launch.py.
Each builds its runner the same way (engine/rank_runner.py with its shard), in step, because loading,
compiling and graph capture contain collectives.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from specd.default_model import resolve_model_path
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.rank_runner import build_rank_runner
from verifier_service.model.config import load_model_config
from verifier_service.parallel.diagnostics import phase
from verifier_service.sharding.shard import RankShard, plan_shard
from verifier_service.sharding.shared_tuning import in_lockstep, share_tuning
from verifier_service.parallel.step_channel import StepChannel

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = timedelta(days=365)  # ranks 1..N-1 wait for the next step this long (an idle verifier)
TUNING_TIMEOUT = timedelta(minutes=10)  # a rank waits this long for the others' timing (NCCL's own default)


def plan_shards(config: EngineConfig) -> list[RankShard]:
    """Every rank's shard of config's model; raises ValueError naming the field when it cannot be split."""
    model_config = load_model_config(resolve_model_path(config.model))
    return [plan_shard(model_config, config.tensor_parallel_size, rank)
            for rank in range(config.tensor_parallel_size)]


def join_and_build(config: EngineConfig, drafts: bool, shards: list[RankShard], rank: int, store: dist.Store,
                   device: torch.device):
    """Every rank's start-up after its process exists (shards: plan_shards(config)): process groups, then its
    runner and channel."""
    shard, alike = shards[rank], len({each.shape for each in shards}) == 1
    with phase(rank, f"joining the process groups ({shard.world_size} ranks, {device.type})"):
        host_group = join_process_groups(rank, shard.world_size, store, device, alike)
    with phase(rank, "loading the shard, KV cache, compiled regions and CUDA graph capture"), in_lockstep():
        runner = build_rank_runner(config, drafts, shard)
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
