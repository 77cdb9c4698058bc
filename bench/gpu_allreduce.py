"""All-reduce latency on one host's GPUs, as a sharded decode step runs it, each captured in a CUDA graph: NCCL,
PyTorch's own one-shot kernel over symmetric memory, and specd's one-shot all-reduce
(verifier_service/parallel/one_shot_all_reduce.py), alone and fused with the residual add + RMSNorm after it.

Usage: python bench/gpu_allreduce.py [--ranks 2,4] [--kb 8,32,128,512,2048] [--dtype bfloat16] [--hidden 4096]
Per rank count and size: a CUDA graph of CALLS back-to-back all-reduces of one tensor, replayed REPLAYS times
after a warm-up, timed with CUDA events on rank 0; us per all-reduce (median replay / CALLS). The sums must equal
NCCL's (checked first, on integer-valued data, so bf16 rounding cannot differ); the fused norm is compared with
NCCL's sum, the add and model/layers.py's RMSNorm (tests/gpu/test_one_shot_all_reduce.py checks long random
sequences of calls). Sizes over the one-shot limit are timed for NCCL only. A Qwen3-8B batch-1 step all-reduces
8 KB (hidden 4096, bf16), 72 times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.model.layers import RMSNorm  # noqa: E402
from verifier_service.parallel.one_shot_all_reduce import MAX_BYTES, OneShotAllReduce  # noqa: E402

CALLS = 50
REPLAYS = 20
EPS = 1e-6


def graphed(fn, *args) -> torch.cuda.CUDAGraph:
    """A CUDA graph of CALLS calls of fn(*args), after one eager warm-up call on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn(*args)
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


def torch_one_shot(dtype: torch.dtype, device: torch.device):
    """PyTorch's one-shot all-reduce (signal-pad barriers, every rank reads every buffer), copy in first."""
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        symm_mem.enable_symm_mem_for_group(group)
    buffer = symm_mem.empty(MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
    symm_mem.rendezvous(buffer, group)

    def run(tensor: torch.Tensor) -> None:
        flat = tensor.view(-1)
        staged = buffer[:flat.numel()]
        staged.copy_(flat)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", group, flat)
    return run


def integers(rows: int, hidden: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers: their sums are exact in bf16 in any order, so every all-reduce must give the same bits."""
    return torch.randint(-8, 9, (rows, hidden), device=device).to(dtype)


def reference_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    total = x.clone()
    dist.all_reduce(total)
    stream = residual + total
    return weight * RMSNorm.normalize(stream, EPS), stream


def rank_main(rank: int, world: int, port: int, sizes_kb: list[int], dtype: torch.dtype, hidden: int,
              rows: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    ours, theirs = OneShotAllReduce(dtype, device).connect(), torch_one_shot(dtype, device)
    weight = torch.randn(hidden, device=device).to(dtype)
    for kb in sizes_kb:
        numel = kb * 1024 // dtype.itemsize
        data = torch.randint(-4, 5, (numel,), device=device).to(dtype) * (rank + 1)
        expected = data.clone()
        dist.all_reduce(expected)
        row = {"ranks": world, "kb": kb, "nccl_us": us_per_call(graphed(dist.all_reduce, data.clone()))}
        if ours.fits(data):
            got = data.clone()
            ours(got)
            row["equal"] = bool(torch.equal(got, expected))
            row["torch_us"] = us_per_call(graphed(theirs, data.clone()))
            row["one_shot_us"] = us_per_call(graphed(ours, data.clone()))
            shape = (numel // hidden, hidden)
            x, residual = integers(*shape, dtype, device), integers(*shape, dtype, device)
            normed, stream = ours.add_rms_norm(x, residual, weight, EPS)
            want_normed, want_stream = reference_norm(x, residual, weight)
            row["norm_stream_equal"] = bool(torch.equal(stream, want_stream))
            row["norm_max_diff"] = float((normed.float() - want_normed.float()).abs().max())
            row["fused_us"] = us_per_call(graphed(ours.add_rms_norm, x, residual, weight, EPS))
        if rank == 0:
            rows.append(row)
            print(row, flush=True)
    dist.barrier()
    del ours, theirs
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--kb", default="8,32,128,512,2048")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--hidden", type=int, default=4096)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    sizes = [int(k) for k in args.kb.split(",")]
    results = []
    for world in (int(r) for r in args.ranks.split(",")):
        if world > torch.cuda.device_count():
            continue
        with mp.Manager() as manager:
            rows = manager.list()
            mp.spawn(rank_main, args=(world, 29500 + world, sizes, dtype, args.hidden, rows), nprocs=world)
            results += list(rows)
    print(f"\n{torch.cuda.get_device_name()}, {args.dtype}, one CUDA graph of {CALLS} all-reduces, "
          f"median of {REPLAYS} replays; one shot up to {MAX_BYTES >> 10} KB; fused = + residual add + RMSNorm "
          f"(rows of {args.hidden})")
    print("| ranks | KB | NCCL us | PyTorch one-shot us | one-shot us | fused us | NCCL / one-shot | same sums "
          "| fused: stream equal, norm max diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        one = r.get("one_shot_us")
        if one:
            print(f"| {r['ranks']} | {r['kb']} | {r['nccl_us']:.1f} | {r['torch_us']:.1f} | {one:.1f} | "
                  f"{r['fused_us']:.1f} | {r['nccl_us'] / one:.2f}x | {r['equal']} | "
                  f"{r['norm_stream_equal']}, {r['norm_max_diff']:.4f} |")
        else:
            print(f"| {r['ranks']} | {r['kb']} | {r['nccl_us']:.1f} | - | - | - | - | - | - |")


if __name__ == "__main__":
    main()
