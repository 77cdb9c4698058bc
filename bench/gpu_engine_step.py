"""Batch-1 decode through the whole engine on the GPU: milliseconds per step (= per token), async
scheduling on and off, next to the graph replay alone (the device's share of a step).

Usage: python bench/gpu_engine_step.py MODEL_DIR [MODEL_DIR ...] [--tokens 256] [--rounds 2]
(checkpoints from bench/make_random_model.py; speculation off, greedy, ignore_eos, prompt of 512 tokens).
A step of bench/gpu_latency.py is one runner call ending in a sync; here the engine loop runs as the
verifier runs it, so with async scheduling the host's part of step N + 1 overlaps the device's step N.
floor = weight bytes / measured copy bandwidth, as in bench/gpu_latency.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_latency import copy_bandwidth  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402

PROMPT_LEN = 512


def ms_per_step(engine: Engine, tokens: int) -> float:
    """Decode `tokens` tokens for one request; ms per decode step (the prefill step excluded)."""
    engine.add_request("a", list(range(1, PROMPT_LEN + 1)), SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.step()  # prefill (+ with async scheduling, the first decode step launched)
    torch.cuda.synchronize()
    produced, start = 1, time.perf_counter()
    while engine.has_unfinished_requests():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return (time.perf_counter() - start) * 1e3 / (produced - 1)


def measure(model_dir: str, tokens: int, rounds: int, bandwidth: float) -> dict:
    config = EngineConfig(model=model_dir, device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                          max_num_seqs=8, max_model_len=4096, num_speculative_tokens=0, enable_prefix_caching=False)
    engine = Engine(config)
    ms_per_step(engine, 16)  # warm-up
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    row = {"model": Path(model_dir).name, "tokens": tokens, "floor": weight_bytes / bandwidth * 1e3}
    for round_index in range(rounds):
        for mode in ("sync", "async"):
            engine.async_scheduling = mode == "async"
            row.setdefault(mode, []).append(ms_per_step(engine, tokens))
    batch = engine.runner.graphs
    replay = [g for (b, w), (g, _) in batch._graphs.items() if b == 1 and w == 1][0]
    torch.cuda.synchronize()
    times = []
    for _ in range(100):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    row["replay"] = sorted(times)[50]
    del engine
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    rows = [measure(m, args.tokens, args.rounds, bandwidth) for m in args.models]
    card = torch.cuda.get_device_name()
    print(json.dumps({"card": card, "rows": rows}, indent=1))
    print(f"\n{card}, batch 1, prompt {PROMPT_LEN}, {args.tokens} tokens, speculation off; ms per decode step")
    print("| model | floor | sync (runs) | async (runs) | decode graph replay | async / floor |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['floor']:.3f} | {' / '.join(f'{x:.3f}' for x in r['sync'])} | "
              f"{' / '.join(f'{x:.3f}' for x in r['async'])} | {r['replay']:.3f} | {min(r['async']) / r['floor']:.2f}x |")


if __name__ == "__main__":
    main()
