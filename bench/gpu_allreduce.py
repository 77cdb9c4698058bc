"""All-reduce latency on one host's GPUs, as a sharded decode step runs it: NCCL against the one-shot all-reduce over
symmetric memory (verifier_service/parallel/one_shot_all_reduce.py), each captured in a CUDA graph.

Usage: python bench/gpu_allreduce.py [--ranks 2,4] [--kb 8,32,128,512,2048] [--dtype bfloat16]
Per rank count and size: a CUDA graph of CALLS back-to-back all-reduces of one tensor, replayed REPLAYS times
after a warm-up, timed with CUDA events on rank 0; us per all-reduce (median replay / CALLS). Both paths must
give the same sums (checked first, on integer-valued data, so bf16 rounding cannot differ). Sizes over the
one-shot path's limit are timed for NCCL only. A Qwen3-8B batch-1 step all-reduces 8 KB (hidden 4096, bf16),
72 times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.parallel.one_shot_all_reduce import MAX_BYTES, OneShotAllReduce  # noqa: E402

CALLS = 50
REPLAYS = 20


def graphed(fn, tensor: torch.Tensor) -> torch.cuda.CUDAGraph:
    """A CUDA graph of CALLS calls of fn(tensor), after one eager warm-up call on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(tensor)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn(tensor)
    return graph


def us_per_call(graph: torch.cuda.CUDAGraph) -> float:
    times = []
    for _ in range(REPLAYS + 3):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times[3:])


def rank_main(rank: int, world: int, port: int, sizes_kb: list[int], dtype: torch.dtype, rows: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    one_shot = OneShotAllReduce(dtype, device)
    for kb in sizes_kb:
        numel = kb * 1024 // dtype.itemsize
        data = torch.randint(-4, 5, (numel,), device=device).to(dtype) * (rank + 1)
        expected = data.clone()
        dist.all_reduce(expected)
        row = {"ranks": world, "kb": kb, "nccl_us": us_per_call(graphed(dist.all_reduce, data.clone()))}
        if one_shot.fits(data):
            got = data.clone()
            one_shot(got)
            torch.cuda.synchronize()
            row["equal"] = bool(torch.equal(got, expected))
            row["one_shot_us"] = us_per_call(graphed(one_shot, data.clone()))
        if rank == 0:
            rows.append(row)
            print(row, flush=True)
    dist.barrier()
    del one_shot
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--kb", default="8,32,128,512,2048")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    sizes = [int(k) for k in args.kb.split(",")]
    results = []
    for world in (int(r) for r in args.ranks.split(",")):
        if world > torch.cuda.device_count():
            continue
        with mp.Manager() as manager:
            rows = manager.list()
            mp.spawn(rank_main, args=(world, 29500 + world, sizes, dtype, rows), nprocs=world)
            results += list(rows)
    print(f"\n{torch.cuda.get_device_name()}, {args.dtype}, one CUDA graph of {CALLS} all-reduces, "
          f"median of {REPLAYS} replays; one shot up to {MAX_BYTES >> 10} KB")
    print("| ranks | KB | NCCL us | one-shot us | NCCL / one-shot | same sums |")
    print("|---|---|---|---|---|---|")
    for r in results:
        one = r.get("one_shot_us")
        shot, ratio = (f"{one:.1f}", f"{r['nccl_us'] / one:.2f}x") if one else ("-", "-")
        print(f"| {r['ranks']} | {r['kb']} | {r['nccl_us']:.1f} | {shot} | {ratio} | {r.get('equal', '-')} |")


if __name__ == "__main__":
    main()
