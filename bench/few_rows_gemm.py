"""A step's GEMMs at a few rows: cuBLAS (F.linear) against kernels/triton_linear.py, in CUDA graphs, by row count.

    python -m bench.few_rows_gemm [--model DIR] [--rows 1 2 5 8 10 16 32] [--block-m 16] [--replays 50]

For each row count, one CUDA graph per kind holds every layer's four projections (qkv, o, gate_up, down) of the
model's shapes, one after another on the stream as in a step (each layer's own weights: the model's weights do
not fit in L2), the Triton GEMM launched with PDL where the card has it. Its replays are timed with CUDA events;
the table gives the device time per step and triton / cublas, for each of the Triton GEMM's row tiles
(--block-m), with K split where its column tiles leave SMs idle and without (--split-k). SPECD_FEW_ROW_GEMMS's row
limit (model/compile.py TRITON_ROWS_MAX) comes from where the ratio crosses 1.
"""
from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F

from verifier_service.kernels import triton_linear
from verifier_service.model.config import ModelConfig, load_model_config


def weights(config: ModelConfig, dtype: torch.dtype) -> list[list[torch.Tensor]]:
    """Each layer's (qkv, o, gate_up, down) weights, [out, in], random."""
    head = config.head_dim
    q, kv = config.num_heads * head, config.num_kv_heads * head
    shapes = [(q + 2 * kv, config.hidden_size), (config.hidden_size, q),
              (2 * config.intermediate_size, config.hidden_size), (config.hidden_size, config.intermediate_size)]
    return [[torch.randn(shape, device="cuda", dtype=dtype) / shape[1] ** 0.5 for shape in shapes]
            for _ in range(config.num_layers)]


def step_us(layers: list[list[torch.Tensor]], rows: int, product, replays: int) -> float:
    """Device microseconds of one replay of a graph running every layer's projections at `rows` rows."""
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device="cuda", dtype=w.dtype) for w in layers[0]}

    def step():
        for layer in layers:
            for weight in layer:
                product(inputs[weight.shape[1]], weight)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # compiles the Triton kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a checkpoint folder (its config alone is read)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 10, 16, 32])
    parser.add_argument("--block-m", type=int, nargs="+", default=[16], help="the Triton GEMM's row tiles to time")
    parser.add_argument("--split-k", choices=["on", "off", "both"], default="both",
                        help="the Triton GEMM with K split where its column tiles leave SMs idle, without, or both")
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    from specd.default_model import resolve_model_path

    config = load_model_config(resolve_model_path(args.model))
    layers = weights(config, torch.bfloat16)
    splits = {"on": [True], "off": [False], "both": [True, False]}[args.split_k]
    kinds = {"cublas": F.linear} | {f"triton m{m}{'' if split else ' whole K'}":
                                    functools.partial(triton_linear.linear, block_m=m, split_k=split)
                                    for m in args.block_m for split in splits}
    print(f"{torch.cuda.get_device_name()}: {config.num_layers} layers x 4 projections, bfloat16, us a step "
          f"(triton / cublas)")
    print(f"{'rows':>5} " + " ".join(f"{kind:>20}" for kind in kinds))
    for rows in args.rows:
        us = {kind: step_us(layers, rows, product, args.replays) for kind, product in kinds.items()}
        cells = [f"{us['cublas']:>20.1f}"] + [f"{us[kind]:>11.1f} ({us[kind] / us['cublas']:.2f}x)"
                                              for kind in kinds if kind != "cublas"]
        print(f"{rows:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()
