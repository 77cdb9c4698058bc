"""Tensor parallelism on the GPU: batch-1 steps at TP = 1 / 2 / 4, and throughput on nano-vllm's workload.

Usage:
  python bench/gpu_tp.py latency PRESET [--tp 1,2,4] [--tokens 128] [--speculation]
  python bench/gpu_tp.py throughput MODEL_DIR [--tp 2] [--num-seqs 128] [--peer-log NANO_TP_LOG]

latency: PRESET is one of bench/make_random_model.py's (qwen3-8b, llama3-70b, ...). Only its config.json is
written; each rank draws its shard's weights on its own GPU (EngineConfig.random_weights), so Llama-3-70B needs
no 140 GB checkpoint. Per TP, through the engine at batch 1 (prompt 512, async scheduling, as the verifier runs):
ms per decode step, ms per verify step (k = 4 drafts every step, always rejected: the cost of a verify step), the
weight-read floor of one GPU (its shard's bytes / measured copy bandwidth, as bench/gpu_latency.py counts it) and
the decode step relative to TP = 1. --speculation adds ms per token with drafts replayed from the plain run (all
right: the most k = 4 can give) next to ms per token without drafts; speculation pays on a workload whose mean
tokens per verify step exceed `verify / decode`.
throughput: MODEL_DIR is a checkpoint (make_random_model.py writes one; nano-vllm needs one too). Output tok/s on
nano-vllm's workload (bench/gpu_throughput.workload; nano_tp.py runs the same one), speculation off; with
--peer-log, the ratio to nano-vllm's own numbers from the same call (peers/run_nano_vllm.sh MODEL_DIR tp2).
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_engine_step import FixedDrafts  # noqa: E402
from bench.gpu_latency import copy_bandwidth  # noqa: E402
from bench.gpu_throughput import run, workload  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine, build_model_runner  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402

PROMPT = list(range(1, 513))
K = 4


class ReplayDrafts:
    """Drafts the continuation a plain greedy run produced: every draft is right (barring bf16 near-ties)."""

    def __init__(self, continuation: list[int]):
        self.continuation = continuation

    def propose(self, requests):
        return {r.request_id: self.continuation[len(r.token_ids) - len(PROMPT):][:r.num_draft_tokens] for r in requests}

    def release(self, request_ids):
        pass


def generate(engine: Engine, tokens: int, k: int = 0) -> tuple[list[int], float, int]:
    """One greedy request after PROMPT: (its tokens, seconds after the prefill step, steps after it)."""
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=tokens, ignore_eos=True, num_speculative_tokens=k))
    output = [token for o in engine.step() for token in o.new_token_ids]  # the prefill
    torch.cuda.synchronize()
    engine.take_step_stats()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        output += [token for o in engine.step() for token in o.new_token_ids]
    return output, time.perf_counter() - start, len(engine.take_step_stats())


def latency_row(name: str, model_dir: Path, tp: int, tokens: int, bandwidth: float, speculation: bool) -> dict:
    config = EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", block_size=256,
                          kv_cache_bytes=1 << 30, max_num_seqs=1, max_model_len=4096, num_speculative_tokens=K,
                          max_speculative_tokens=K, adaptive_drafting=False, enable_prefix_caching=False,
                          tensor_parallel_size=tp, random_weights=True)
    started = time.perf_counter()
    runner = build_model_runner(config)  # one set of ranks for the engines below
    try:
        plain, drafted = Engine(config, None, runner), Engine(config, FixedDrafts(), runner)
        generate(plain, 16)  # warm-up: the eager shapes compile here
        generate(drafted, 16, K)
        row = {"model": name, "tp": tp, "start_s": time.perf_counter() - started,
               "weights_GB": sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 1e9}
        row["floor_ms"] = row["weights_GB"] * 1e9 / bandwidth * 1e3
        continuation, seconds, steps = generate(plain, tokens)
        row["decode_ms"], row["plain_ms_per_token"] = seconds * 1e3 / steps, seconds * 1e3 / (tokens - 1)
        _, seconds, steps = generate(drafted, tokens, K)
        row["verify_ms"] = seconds * 1e3 / steps
        if speculation:
            _, seconds, steps = generate(Engine(config, ReplayDrafts(continuation), runner), tokens, K)
            row["replayed_ms_per_token"], row["tokens_per_step"] = seconds * 1e3 / (tokens - 1), (tokens - 1) / steps
    finally:
        runner.close()
        release_memory()
    print(json.dumps(row), flush=True)
    return row


def throughput_row(model_dir: Path, tp: int, num_seqs: int) -> dict:
    config = EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=0,
                          kv_cache_memory_fraction=0.75, max_num_seqs=256, max_num_batched_tokens=16384,
                          max_model_len=4096, num_speculative_tokens=0, enable_prefix_caching=False,
                          tensor_parallel_size=tp)
    prompts, max_tokens = workload(num_seqs)
    started = time.perf_counter()
    engine = Engine(config)
    try:
        run(engine, [prompts[0][:100]], [16])  # warm-up (compiles the prefill shapes)
        start_s = time.perf_counter() - started
        gc.collect()
        gc.freeze()  # as the verifier does after its warm-up
        seconds, produced = run(engine, prompts, max_tokens)
    finally:
        engine.runner.close()
        gc.unfreeze()
        release_memory()
    row = {"model": model_dir.name, "tp": tp, "num_seqs": num_seqs, "seconds": seconds, "output_tokens": produced,
           "tok_per_s": produced / seconds, "start_s": start_s}
    print(json.dumps(row), flush=True)
    return row


def release_memory() -> None:
    torch._dynamo.reset()  # compiled regions hold the model
    gc.collect()
    torch.cuda.empty_cache()


def write_config(preset: str) -> Path:
    from bench.make_random_model import PRESETS

    folder = Path(tempfile.mkdtemp(prefix=f"specd-{preset}-"))
    PRESETS[preset]().save_pretrained(folder)  # config.json only: the weights are drawn on the GPUs
    return folder


def peer_numbers(log: Path | None, tp: int) -> dict[str, float]:
    """nano-vllm's 'TP=N batch-1 decode step X ms' and 'TP=N throughput Y tok/s' lines (peers/nano_tp.py)."""
    if log is None or not log.is_file():
        return {}
    text = log.read_text(errors="replace")
    numbers = {}
    for key, pattern in (("step_ms", rf"TP={tp} batch-1 decode step ([\d.]+) ms"),
                         ("tok_per_s", rf"TP={tp} throughput ([\d.]+) tok/s")):
        found = re.search(pattern, text)
        if found:
            numbers[key] = float(found.group(1))
    return numbers


def print_latency(rows: list[dict], card: str, bandwidth: float) -> None:
    print(f"\n{card} x{torch.cuda.device_count()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s, batch 1, prompt 512")
    print("| model | TP | weights / GPU GB | floor ms | decode ms | decode / floor | decode / TP 1 | verify k=4 ms "
          "| verify / decode | ms/token: no drafts / replayed drafts (tokens/step) | start s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = {r["model"]: r["decode_ms"] for r in rows if r["tp"] == 1}
    for r in rows:
        ratio = f"{r['decode_ms'] / base[r['model']]:.2f}" if r["model"] in base else "-"
        spec = (f"{r['plain_ms_per_token']:.3f} / {r['replayed_ms_per_token']:.3f} ({r['tokens_per_step']:.2f})"
                if "replayed_ms_per_token" in r else "-")
        print(f"| {r['model']} | {r['tp']} | {r['weights_GB']:.2f} | {r['floor_ms']:.3f} | {r['decode_ms']:.3f} | "
              f"{r['decode_ms'] / r['floor_ms']:.2f} | {ratio} | {r['verify_ms']:.3f} | "
              f"{r['verify_ms'] / r['decode_ms']:.2f} | {spec} | {r['start_s']:.0f} |")


def print_throughput(rows: list[dict], card: str, peer_log: Path | None) -> None:
    print(f"\n{card} x{torch.cuda.device_count()}, nano-vllm's workload, speculation off")
    print("| model | TP | seqs | output tokens | seconds | tok/s | nano-vllm tok/s (same call) | ratio | start s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = peer_numbers(peer_log, r["tp"]).get("tok_per_s")
        versus = f"{peer:.0f} | {r['tok_per_s'] / peer:.2f}x" if peer else "- | -"
        print(f"| {r['model']} | {r['tp']} | {r['num_seqs']} | {r['output_tokens']} | {r['seconds']:.2f} | "
              f"{r['tok_per_s']:.0f} | {versus} | {r['start_s']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=("latency", "throughput"))
    parser.add_argument("model", help="latency: a make_random_model.py preset; throughput: a checkpoint folder")
    parser.add_argument("--tp", default=None, help="comma-separated TP sizes (latency: 1,2,4; throughput: 2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--speculation", action="store_true")
    parser.add_argument("--num-seqs", type=int, default=128)
    parser.add_argument("--peer-log", type=Path, default=None)
    args = parser.parse_args()
    card = torch.cuda.get_device_name()
    if args.part == "latency":
        sizes = [int(t) for t in (args.tp or "1,2,4").split(",") if int(t) <= torch.cuda.device_count()]
        bandwidth = copy_bandwidth()
        model_dir = write_config(args.model)
        rows = [latency_row(args.model, model_dir, tp, args.tokens, bandwidth, args.speculation) for tp in sizes]
        print_latency(rows, card, bandwidth)
    else:
        sizes = [int(t) for t in (args.tp or "2").split(",")]
        rows = [throughput_row(Path(args.model), tp, args.num_seqs) for tp in sizes]
        print_throughput(rows, card, args.peer_log)


if __name__ == "__main__":
    main()
