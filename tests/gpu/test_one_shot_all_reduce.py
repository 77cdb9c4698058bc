"""The one-shot all-reduce (verifier_service/sharding/one_shot_all_reduce.py) on 2 and 4 GPUs: every call of a long
random sequence - plain sums and sums fused with the residual add + RMSNorm, row counts drawn anew each call, so
that its programs' parities run out of step with each other - gives NCCL's result, eagerly and replayed from one
CUDA graph with new data at every replay. The data are small integers, whose sums are exact in bf16 in any order:
the sums and the residual stream must equal NCCL's bit for bit, the normed rows within bf16 rounding."""
from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.local_stack import free_port

pytestmark = pytest.mark.gpu
HIDDEN, EPS, CALLS, REPLAYS = 4096, 1e-6, 120, 10


def integers(rows: int, device: torch.device) -> torch.Tensor:
    return torch.randint(-8, 9, (rows, HIDDEN), device=device).to(torch.bfloat16)


def expected(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor):
    """NCCL's sum of x; with a residual, (weight * rms_norm(stream), stream) as the model's RMSNorm gives them."""
    from verifier_service.model.layers import RMSNorm

    total = x.clone()
    dist.all_reduce(total)
    if residual is None:
        return total
    stream = residual + total
    return weight * RMSNorm.normalize(stream, EPS), stream


def mismatches(got, want) -> int:
    if isinstance(want, torch.Tensor):
        return int(not torch.equal(got, want))
    (normed, stream), (want_normed, want_stream) = got, want
    return int(not torch.equal(stream, want_stream)) + int((normed.float() - want_normed.float()).abs().max() > 0.07)


def run(one_shot, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor):
    if residual is None:
        one_shot(x)
        return x
    return one_shot.add_rms_norm(x, residual, weight, EPS)


def rank_main(rank: int, world: int, port: int, results) -> None:
    from verifier_service.sharding.one_shot_all_reduce import OneShotAllReduce

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    one_shot = OneShotAllReduce(torch.bfloat16, device).connect()
    rng = random.Random(0)  # the same draws on both ranks
    max_rows = one_shot.slot // HIDDEN
    weight = torch.randn(HIDDEN, device=device).to(torch.bfloat16)
    wrong = 0
    for _ in range(CALLS):
        x, residual = integers(rng.randint(1, max_rows), device), None
        if rng.random() < 0.5:
            residual = integers(x.shape[0], device)
        want = expected(x, residual, weight)
        wrong += mismatches(run(one_shot, x, residual, weight), want)
    calls = [(rng.randint(1, max_rows), rng.random() < 0.5) for _ in range(12)]
    inputs = [(integers(rows, device), integers(rows, device) if fused else None) for rows, fused in calls]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        [run(one_shot, x, residual, weight) for x, residual in inputs]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [run(one_shot, x, residual, weight) for x, residual in inputs]
    for _ in range(REPLAYS):
        fresh = [(integers(x.shape[0], device), None if r is None else integers(x.shape[0], device)) for x, r in inputs]
        for (x, residual), (new_x, new_residual) in zip(inputs, fresh):
            x.copy_(new_x)
            if residual is not None:
                residual.copy_(new_residual)
        graph.replay()
        wrong += sum(mismatches(got, expected(x, r, weight)) for got, (x, r) in zip(outputs, fresh))
    results[rank] = (wrong, CALLS + REPLAYS * len(calls))
    dist.barrier()
    del graph, one_shot
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_every_call_of_a_random_sequence_equals_nccl_eagerly_and_replayed(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, {torch.cuda.device_count()} visible")
    pytest.importorskip("triton")
    port = free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(world, port, results), nprocs=world)
        results = dict(results)
    print("wrong / checked per rank:", results)
    assert all(wrong == 0 for wrong, _ in results.values()), results
