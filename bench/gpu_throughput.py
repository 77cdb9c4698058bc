"""Throughput on nano-vllm's bench.py workload: 256 sequences, input and output lengths uniform in
[100, 1024], random token ids, temperature 0.6, ignore_eos; speculation off, and n-gram speculation on.

Usage: python bench/gpu_throughput.py MODEL_DIR [--eager] [--num-seqs 256]
Throughput = output tokens / wall time of the whole run (prefill included), as nano-vllm counts it.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402


def workload(num_seqs: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(num_seqs)]
    max_tokens = [rng.randint(100, 1024) for _ in range(num_seqs)]
    return prompts, max_tokens


def run(engine: Engine, prompts, max_tokens) -> tuple[float, int]:
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(f"s{i}", prompt, SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True))
    produced = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return time.perf_counter() - start, produced


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--num-seqs", type=int, default=256)
    args = parser.parse_args()
    prompts, max_tokens = workload(args.num_seqs)
    rows = []
    for speculation in (False, True):
        config = EngineConfig(model=args.model, device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=0,
                              kv_cache_memory_fraction=0.75, max_num_seqs=256, max_num_batched_tokens=16384,
                              max_model_len=4096, num_speculative_tokens=4 if speculation else 0,
                              enable_prefix_caching=False, enforce_eager=args.eager)
        proposer = None
        if speculation:
            from drafter_service.local import LocalNgramProposer

            proposer = LocalNgramProposer()
        started = time.perf_counter()
        engine = Engine(config, proposer)
        load_s = time.perf_counter() - started
        run(engine, [prompts[0][:100]], [16])  # warm-up
        engine.take_step_stats()
        seconds, produced = run(engine, prompts, max_tokens)
        stats = engine.take_step_stats()
        rows.append({"speculation": speculation, "seconds": seconds, "output_tokens": produced,
                     "tok_per_s": produced / seconds, "steps": len(stats), "load_and_capture_s": load_s,
                     "graphs": engine.runner.graphs is not None})
        del engine
        torch.cuda.empty_cache()
    card = torch.cuda.get_device_name()
    print(json.dumps({"card": card, "rows": rows}, indent=1))
    print(f"\n{card}, {args.num_seqs} seqs, {'eager' if args.eager else 'CUDA graphs'}")
    print("| speculation | output tokens | seconds | tok/s | steps | vs nano-vllm H200 14,943 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'n-gram k=4' if r['speculation'] else 'off'} | {r['output_tokens']} | {r['seconds']:.2f} | "
              f"{r['tok_per_s']:.0f} | {r['steps']} | {r['tok_per_s'] / 14943:.2f}x |")
    print(f"speculation on / off: {rows[1]['tok_per_s'] / rows[0]['tok_per_s']:.3f}")


if __name__ == "__main__":
    main()
