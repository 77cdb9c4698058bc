"""Setting up the one-shot all-reduce is all or nothing: its steps run on every rank, and where one rank's step fails
every rank gets None (and keeps NCCL) instead of going on to a collective step the failed rank never joins
(one_shot_all_reduce.on_every_rank; gloo, 2 processes)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.local_stack import free_port

pytestmark = pytest.mark.timeout(120)


def rank_main(rank: int, port: int, failing_rank: int | None, results) -> None:
    from verifier_service.sharding.one_shot_all_reduce import on_every_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    def make() -> str:
        if rank == failing_rank:
            raise RuntimeError("peer access unavailable")
        return f"buffer of rank {rank}"

    results[rank] = on_every_rank(make, torch.device("cpu"), "allocate its buffer")
    dist.barrier()  # both ranks got past the agreement: neither waits in a step the other gave up
    dist.destroy_process_group()


@pytest.mark.parametrize("failing_rank", [None, 0, 1])
def test_every_rank_gets_its_result_only_where_every_rank_succeeded(failing_rank):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(free_port(), failing_rank, results), nprocs=2)
        results = dict(results)
    if failing_rank is None:
        assert results == {0: "buffer of rank 0", 1: "buffer of rank 1"}
    else:
        assert results == {0: None, 1: None}


def bind_twice(_rank: int) -> None:
    """In a process of its own: torch's binding outlives the process groups, and would hold this test's dead group
    for every later test of the session (tests/gpu's one-shot cases among them)."""
    from verifier_service.sharding.one_shot_all_reduce import bound_to_another_group, enable_symmetric_memory

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        first = dist.group.WORLD
        assert enable_symmetric_memory(first) == first.group_name
        assert enable_symmetric_memory(first) == first.group_name  # again for the same group: fine
    finally:
        dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        second = dist.group.WORLD
        assert second.group_name == first.group_name and bound_to_another_group(second)
        with pytest.raises(RuntimeError, match="earlier process group named"):
            enable_symmetric_memory(second)
    finally:
        dist.destroy_process_group()


def test_symmetric_memory_of_a_second_process_group_of_the_same_name_is_refused_not_left_to_hang():
    """torch keeps a group name's symmetric memory bound to the first process group of that name: a process that
    builds a sharded engine again (tests, benches) refuses the one shot (every rank then keeps NCCL) instead of
    waiting forever in a rendezvous through the first group's store."""
    mp.spawn(bind_twice, nprocs=1)  # a failed assertion in the child raises here
