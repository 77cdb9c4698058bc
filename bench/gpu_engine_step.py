"""Batch-1 steps through the whole engine on the GPU: ms per decode step and per verify step at k = 2, 4, 8
(a fixed-draft proposer: every step scores k drafts), synchronous and with async scheduling (a step launched
behind the one in flight, its drafts guessed from a lookahead proposal), the graph replays of each width
alone (the device's share of a step), and a batch of four requests asking k = 0, 2, 4, 8 at once on a server
whose default k is 4 and maximum 8 (mixed k: every step pads to the widest, all replay graphs).

Usage: python bench/gpu_engine_step.py MODEL_DIR [MODEL_DIR ...] [--tokens 256] [--rounds 2]
(checkpoints from bench/make_random_model.py; greedy, ignore_eos, prompt of 512 tokens).
floor = weight bytes / measured copy bandwidth, as in bench/gpu_latency.py. Targets (issue 13): verify at
k = 4 <= 1.15x the decode step through the engine, k = 8 <= 1.25x.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_latency import copy_bandwidth, timed  # noqa: E402
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402
from verifier_service.engine.stats import STAGES  # noqa: E402

PROMPT_LEN = 512
KS = (2, 4, 8)


class FixedDrafts:
    """A proposer that drafts copies of the last token: every step scores all its draft slots (random
    weights accept almost none; acceptance does not change a step's cost)."""

    def propose(self, requests):
        return {r.request_id: [r.token_ids[-1]] * r.num_draft_tokens for r in requests}

    def release(self, request_ids):
        pass


def ms_per_step(engine: Engine, tokens: int, ks: tuple[int, ...]) -> tuple[float, dict[str, float]]:
    """One request per k in ks (k drafts per step each), `tokens` output tokens each; (ms per step after the
    prefill step, mean ms per stage)."""
    for i, k in enumerate(ks):
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, num_speculative_tokens=k)
        engine.add_request(f"r{i}", [(7 * i + j) % 1000 + 1 for j in range(PROMPT_LEN)], params)
    engine.step()  # prefill (+ with async scheduling, the first decode step launched)
    torch.cuda.synchronize()
    engine.take_step_stats()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    seconds = time.perf_counter() - start
    stats = engine.take_step_stats()
    stages = {stage: sum(s.stage_seconds.get(stage, 0.0) for s in stats) * 1e3 / len(stats) for stage in STAGES}
    return seconds * 1e3 / len(stats), stages


def measure(model_dir: str, tokens: int, rounds: int, bandwidth: float) -> dict:
    config = EngineConfig(model=model_dir, device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                          max_num_seqs=8, max_model_len=4096, num_speculative_tokens=4, max_speculative_tokens=8,
                          adaptive_drafting=False, enable_prefix_caching=False)
    started = time.perf_counter()
    engine = Engine(config, FixedDrafts())
    row = {"model": Path(model_dir).name, "tokens": tokens, "start_up_s": time.perf_counter() - started,
           "graphs": len(engine.runner.graphs._graphs), "widths": engine.runner.graphs.widths}  # noqa: SLF001
    ms_per_step(engine, 16, (4,))  # warm-up
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    row["floor"] = weight_bytes / bandwidth * 1e3
    for _ in range(rounds):
        for mode in ("sync", "async"):
            engine.async_scheduling = mode == "async"
            row.setdefault(f"decode {mode}", []).append(ms_per_step(engine, tokens, (0,))[0])
            for k in KS:
                ms, stages = ms_per_step(engine, tokens, (k,))
                row.setdefault(f"k={k} {mode}", []).append(ms)
                row[f"stages k={k} {mode}"] = stages
        engine.async_scheduling = True
        row.setdefault("mixed 0/2/4/8", []).append(ms_per_step(engine, tokens, (0, 2, 4, 8))[0])
        row.setdefault("mixed 0/0/0/0", []).append(ms_per_step(engine, tokens, (0, 0, 0, 0))[0])
    print(json.dumps(row), flush=True)
    graphs, table = engine.runner.graphs, list(range(4))
    for width in graphs.widths:  # one real step of this width sets the graph's inputs, then replays alone
        step = ScheduledRequest("replay", [1] * width, PROMPT_LEN + tokens, table, width - 1, width)
        graphs.run(ScheduledBatch([step]), (1, width))
        graph, _ = graphs._graphs[(1, width)]  # noqa: SLF001
        row[f"replay w={width}"] = timed(graph.replay, iters=100)
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
    print(f"\n{card}, prompt {PROMPT_LEN}, {args.tokens} tokens; ms per step (best of {args.rounds}); "
          "ratio = step / decode step (async)")
    print("| model | start-up s | graphs | floor | step | sync ms | async ms | async / decode async | replay ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        decode = min(r["decode async"])
        for name, width in [("decode", 1)] + [(f"k={k}", k + 1) for k in KS]:
            replay = r.get(f"replay w={next(w for w in r['widths'] if w >= width)}", float("nan"))
            print(f"| {r['model']} | {r['start_up_s']:.0f} | {r['graphs']} | {r['floor']:.3f} | {name} | "
                  f"{min(r[f'{name} sync']):.3f} | {min(r[f'{name} async']):.3f} | "
                  f"{min(r[f'{name} async']) / decode:.2f}x | {replay:.3f} |")
        mixed, plain = min(r["mixed 0/2/4/8"]), min(r["mixed 0/0/0/0"])
        print(f"| {r['model']} | | | | batch 4, k = 0/2/4/8 (max 8) | | {mixed:.3f} | "
              f"{mixed / plain:.2f}x of batch-4 decode ({plain:.3f}) | |")
    for r in rows:
        print(f"{r['model']} k=4 async, mean ms per stage: "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["stages k=4 async"].items()))


if __name__ == "__main__":
    main()
