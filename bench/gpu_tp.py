"""Tensor parallelism on the GPU: a smoke run, batch-1 steps at TP = 1 / 2 / 4, and throughput on nano-vllm's workload.

Usage:
  python bench/gpu_tp.py smoke eager|graphs|compiled [--tp 2]
  python bench/gpu_tp.py latency PRESET [--tp 1,2,4] [--tokens 128] [--speculation] [--rows ROWS.jsonl] [--kernels]
  python bench/gpu_tp.py throughput MODEL_DIR [--tp 2] [--num-seqs 128] [--peer-log NANO_TP_LOG]

smoke: the cheapest run that says which phase of a TP run stops, on a small random Llama (weights drawn on each
GPU): start-up (process groups, load, KV cache, then CUDA graph capture in graphs / compiled, and torch.compile in
compiled), one request's prefill and decode steps, the same with k = 4 drafts (verify steps, the step in flight's
result sent to the other ranks), three requests at once, then close (every rank drops its graphs and leaves the
process groups). Each phase prints its seconds as it ends; eager = no graphs, no compile (NCCL and the step
channel alone); graphs = captured steps with NCCL inside, no compile; compiled = as the verifier runs.

latency: PRESET is one of bench/make_random_model.py's (qwen3-8b, llama3-70b, ...). Only its config.json is
written; each rank draws its shard's weights on its own GPU (EngineConfig.random_weights), so Llama-3-70B needs
no 140 GB checkpoint. Per TP, through the engine at batch 1 (prompt 512, async scheduling, as the verifier runs):
ms per decode step, ms per verify step (k = 4 drafts every step, always rejected: the cost of a verify step), the
weight-read floor of one GPU (its shard's bytes / measured copy bandwidth, as bench/gpu_latency.py counts it) and
the decode step relative to TP = 1. --speculation adds ms per token with drafts replayed from the plain run (all
right: the most k = 4 can give) next to ms per token without drafts, and how many tokens the two runs share (all
of them, unless greedy with drafts parts from greedy without at a bf16 near-tie; after one, every draft is wrong);
speculation pays on a workload whose mean tokens per verify step exceed `verify / decode`. Random weights lead
greedy decoding from each token t to t + 1 by a wide margin (verifier_service/engine/loader.initialise_random).
throughput: MODEL_DIR is a checkpoint (make_random_model.py writes one; nano-vllm needs one too). Output tok/s on
nano-vllm's workload (bench/gpu_throughput.workload; nano_tp.py runs the same one), speculation off; with
--peer-log, the ratio to nano-vllm's own numbers from the same call (peers/run_nano_vllm.sh MODEL_DIR tp2).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_engine_step import FixedDrafts  # noqa: E402
from bench.gpu_latency import copy_bandwidth  # noqa: E402
from bench.gpu_throughput import run, workload  # noqa: E402
from specd import environment  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine, build_model_runner  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402
from verifier_service.engine.start_up_objects import freeze as freeze_start_up_objects  # noqa: E402
from verifier_service.engine.warm_up import warm_up  # noqa: E402
from verifier_service.parallel.collectives import all_reduce_in_use  # noqa: E402
from bench.tp_timeline import TIMELINE_ENV  # noqa: E402

UNTUNED_ENV = environment.BENCH_UNTUNED  # set: every rank compiles without timing kernels (untuned_compile)


def untuned_compile() -> None:
    """torch.compile without its run-time tuning (max-autotune's candidates, coordinate descent): Inductor's
    heuristics choose each kernel's launch configuration from its shapes, the same on every rank, where tuning
    chooses by timing on each rank's own GPU and the ranks differ (docs/BENCHMARKS.md, round 14)."""
    compile_ = torch.compile

    def compile_untuned(fn, **kwargs):
        kwargs.pop("mode", None)
        options = {**(kwargs.pop("options", None) or {}), "max_autotune": False, "coordinate_descent_tuning": False}
        return compile_(fn, options=options, **kwargs)

    torch.compile = compile_untuned


if environment.bench_untuned():  # this process and the ranks it spawns (which run this module again)
    untuned_compile()
if __name__ == "__mp_main__" and environment.bench_timeline_dir():  # a rank spawned by a --timeline run
    from bench.tp_timeline import install_in_worker

    install_in_worker(environment.bench_timeline_dir())

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


def start_ranks(config: EngineConfig, drafts: bool = True):
    """The runner of config's ranks; a rank that dies or hangs, even during start-up, ends this process at once
    (as it ends the verifier) instead of leaving rank 0 to compile and capture alone until the time limit."""
    def give_up(reason: str) -> None:
        print(f"tensor parallelism failed: {reason}", file=sys.stderr, flush=True)
        os._exit(3)

    return build_model_runner(config, drafts, on_rank_failure=give_up)


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


def latency_row(name: str, model_dir: Path, tp: int, tokens: int, bandwidth: float, speculation: bool,
                kernels: bool = False, timeline: Path | None = None) -> dict:
    config = EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", block_size=256,
                          kv_cache_bytes=1 << 30, max_num_seqs=1, max_model_len=4096, num_speculative_tokens=K,
                          max_speculative_tokens=K, adaptive_drafting=False, enable_prefix_caching=False,
                          tensor_parallel_size=tp, random_weights=True)
    started = time.perf_counter()
    runner = start_ranks(config)  # one set of ranks for the engines below
    try:
        plain, drafted = Engine(config, None, runner), Engine(config, FixedDrafts(), runner)
        generate(plain, 16)  # warm-up: the eager shapes compile here
        generate(drafted, 16, K)
        freeze_start_up_objects()  # as the verifier does after its warm-up
        untuned = " untuned" if environment.bench_untuned() else ""
        row = {"model": name + untuned, "tp": tp, "all_reduce": all_reduce_in_use() if tp > 1 else "-",  # as set up
               "start_s": time.perf_counter() - started,
               "weights_GB": sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 1e9}
        row["floor_ms"] = row["weights_GB"] * 1e9 / bandwidth * 1e3
        continuation, seconds, steps = generate(plain, tokens)
        row["decode_ms"], row["plain_ms_per_token"] = seconds * 1e3 / steps, seconds * 1e3 / (tokens - 1)
        _, seconds, steps = generate(drafted, tokens, K)
        row["verify_ms"] = seconds * 1e3 / steps
        if speculation:
            replayed, seconds, steps = generate(Engine(config, ReplayDrafts(continuation), runner), tokens, K)
            row["replayed_ms_per_token"], row["tokens_per_step"] = seconds * 1e3 / (tokens - 1), (tokens - 1) / steps
            # greedy with drafts must give the plain run's tokens (or part from it first at a bf16 near-tie)
            row["replayed_equal_up_to"] = next((i for i, (a, b) in enumerate(zip(replayed, continuation)) if a != b),
                                               len(continuation))
        print(json.dumps(row), flush=True)  # before close: the numbers stand whatever the teardown does
        if kernels:  # rank 0's device time by kernel over one more plain run (this process sees its own GPU only)
            from bench.kernel_table import print_table, profiled

            (_, seconds, steps), wall, table = profiled(generate, plain, tokens)
            title = (f"rank 0 of {name} at TP {tp}: {steps} decode steps after a prefill, "
                     f"{seconds * 1e3 / steps:.3f} ms a step under the profiler")
            print_table(title, wall, table, top=40)
        if timeline is not None:  # every rank's host and device timeline over one more plain run (tp_timeline.py)
            from bench.tp_timeline import record

            record(timeline / f"tp{tp}", generate, plain, 32)
    finally:
        runner.close()
        gc.unfreeze()
        release_memory()
    return row


def smoke(mode: str, tp: int) -> dict:
    """The smoke run of the module docstring; prints each phase as it ends, returns {phase: seconds}."""
    from transformers import LlamaConfig

    folder = Path(tempfile.mkdtemp(prefix="specd-tp-smoke-"))
    LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                num_key_value_heads=8, max_position_embeddings=4096, torch_dtype="bfloat16").save_pretrained(folder)
    config = EngineConfig(model=str(folder), device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=256 << 20,
                          max_num_seqs=4, max_model_len=2048, num_speculative_tokens=K, max_speculative_tokens=K,
                          adaptive_drafting=False, enable_prefix_caching=False, tensor_parallel_size=tp,
                          random_weights=True, enforce_eager=mode == "eager", compile_model=mode == "compiled")
    seconds: dict[str, float] = {}

    @contextmanager
    def timed(name: str):
        print(f"smoke {mode} tp={tp}: {name} ...", flush=True)
        began = time.perf_counter()
        yield
        seconds[name] = time.perf_counter() - began
        print(f"smoke {mode} tp={tp}: {name} done in {seconds[name]:.2f} s", flush=True)

    with timed("start-up"):
        runner = start_ranks(config)
    try:
        with timed("1 request: prefill + 31 decode steps"):
            generate(Engine(config, None, runner), 32)
        with timed("1 request with k = 4 drafts: prefill + 32 verify steps"):
            generate(Engine(config, FixedDrafts(), runner), 32, K)
        with timed("3 requests with drafts: prefills + verify steps"):
            prompts, _ = workload(3)
            run(Engine(config, FixedDrafts(), runner), [p[:300] for p in prompts], [24] * 3)
    finally:
        with timed("close"):
            runner.close()
    print(json.dumps({"smoke": mode, "tp": tp, **{name: round(s, 3) for name, s in seconds.items()}}), flush=True)
    return seconds


def throughput_row(model_dir: Path, tp: int, num_seqs: int) -> dict:
    config = EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=0,
                          kv_cache_memory_fraction=0.75, max_num_seqs=256, max_num_batched_tokens=16384,
                          max_model_len=4096, num_speculative_tokens=0, enable_prefix_caching=False,
                          tensor_parallel_size=tp)
    prompts, max_tokens = workload(num_seqs)
    started = time.perf_counter()
    engine = Engine(config, None, start_ranks(config, drafts=False))
    try:
        warm_up(engine)  # as the verifier does (the keyed sampler compiles for one row and for several)
        run(engine, [prompts[0][:100]], [16])  # and a prefill of the workload's kind
        start_s = time.perf_counter() - started
        freeze_start_up_objects()  # as the verifier does after its warm-up
        seconds, produced = run(engine, prompts, max_tokens)
        row = {"model": model_dir.name, "tp": tp, "num_seqs": num_seqs, "seconds": seconds, "output_tokens": produced,
               "tok_per_s": produced / seconds, "start_s": start_s}
        print(json.dumps(row), flush=True)  # before close: the numbers stand whatever the teardown does
    finally:
        engine.runner.close()
        gc.unfreeze()
        release_memory()
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
    print("| model | TP | all-reduce | weights / GPU GB | floor ms | decode ms | decode / floor | decode / TP 1 "
          "| verify k=4 ms | verify / decode | ms/token: no drafts / replayed drafts (tokens/step) | start s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = {r["model"]: r["decode_ms"] for r in rows if r["tp"] == 1}
    for r in rows:
        ratio = f"{r['decode_ms'] / base[r['model']]:.2f}" if r["model"] in base else "-"
        spec = (f"{r['plain_ms_per_token']:.3f} / {r['replayed_ms_per_token']:.3f} ({r['tokens_per_step']:.2f}; "
                f"same tokens up to {r['replayed_equal_up_to']})" if "replayed_ms_per_token" in r else "-")
        print(f"| {r['model']} | {r['tp']} | {r.get('all_reduce', 'nccl')} | {r['weights_GB']:.2f} | "
              f"{r['floor_ms']:.3f} | {r['decode_ms']:.3f} | {r['decode_ms'] / r['floor_ms']:.2f} | {ratio} | "
              f"{r['verify_ms']:.3f} | {r['verify_ms'] / r['decode_ms']:.2f} | {spec} | {r['start_s']:.0f} |")


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
    parser.add_argument("part", choices=("smoke", "latency", "throughput"))
    parser.add_argument("model", help="smoke: eager, graphs or compiled; latency: a make_random_model.py preset; "
                                      "throughput: a checkpoint folder")
    parser.add_argument("--tp", default=None, help="comma-separated TP sizes (smoke: 2; latency: 1,2,4; throughput: 2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--speculation", action="store_true")
    parser.add_argument("--num-seqs", type=int, default=128)
    parser.add_argument("--peer-log", type=Path, default=None)
    parser.add_argument("--kernels", action="store_true", help="latency: rank 0's decode steps by kernel (one more "
                        "plain run under torch's profiler, bench/kernel_table.py)")
    parser.add_argument("--timeline", type=Path, default=None, help="latency: every rank's host and device "
                        "timeline over one more plain run, chrome traces in TIMELINE/tpN (bench/tp_timeline.py)")
    parser.add_argument("--rows", type=Path, default=None,
                        help="latency: append each row to this JSON-lines file and print the table of all its rows "
                             "(one table from several runs of one call, e.g. one TP size per run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO,  # rank 0's start-up phases and first steps, as the other ranks log theirs
                        format="%(asctime)s verifier rank 0 %(levelname)s %(name)s: %(message)s")
    card = torch.cuda.get_device_name()
    if args.part == "smoke":
        if args.model not in ("eager", "graphs", "compiled"):
            parser.error(f"smoke: the mode is eager, graphs or compiled, not {args.model!r}")
        for tp in [int(t) for t in (args.tp or "2").split(",")]:
            smoke(args.model, tp)
    elif args.part == "latency":
        sizes = [int(t) for t in (args.tp or "1,2,4").split(",") if int(t) <= torch.cuda.device_count()]
        bandwidth = copy_bandwidth()
        model_dir = write_config(args.model)
        if args.timeline is not None:  # read by the ranks this process spawns
            os.environ[TIMELINE_ENV] = str(args.timeline)
        rows = [latency_row(args.model, model_dir, tp, args.tokens, bandwidth, args.speculation, args.kernels,
                            args.timeline) for tp in sizes]
        if args.rows is not None:
            with args.rows.open("a") as file:
                file.writelines(json.dumps(row) + "\n" for row in rows)
            rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
        print_latency(rows, card, bandwidth)
    else:
        sizes = [int(t) for t in (args.tp or "2").split(",")]
        rows = [throughput_row(Path(args.model), tp, args.num_seqs) for tp in sizes]
        print_throughput(rows, card, args.peer_log)


def watch_exit(limit_s: float = 60.0) -> None:
    """At exit: names the non-daemon threads and child processes still there, and writes every thread's stack and
    ends the process if the exit takes over limit_s (round 13: the throughput part printed its table, then did not
    exit in 160 s on four H100s; the latency part exited)."""
    import atexit
    import faulthandler
    import multiprocessing
    import threading

    def report() -> None:
        threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
        print(f"exiting: non-daemon threads {threads}, child processes {multiprocessing.active_children()}",
              flush=True)
        faulthandler.dump_traceback_later(limit_s, exit=True)

    atexit.register(report)  # registered after main's own (torch's compile pools, ...), so it runs first


if __name__ == "__main__":
    main()
    watch_exit()
