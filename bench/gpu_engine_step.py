"""Batch-1 steps through the whole engine on the GPU: ms per decode step with async scheduling off and on,
ms per verify step (k = 4 drafts every step, always synchronous), next to the graph replays alone (the
device's share of a step).

Usage: python bench/gpu_engine_step.py MODEL_DIR [MODEL_DIR ...] [--tokens 256] [--rounds 2]
(checkpoints from bench/make_random_model.py; greedy, ignore_eos, prompt of 512 tokens).
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
from bench.gpu_latency import copy_bandwidth, timed  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402
from verifier_service.engine.stats import STAGES  # noqa: E402

PROMPT_LEN = 512
K = 4


class FixedDrafts:
    """A proposer that always drafts k copies of the last token: every step scores k + 1 tokens
    (random weights accept almost none; acceptance does not change a step's cost)."""

    def propose(self, requests):
        return {r.request_id: [r.token_ids[-1]] * r.num_draft_tokens for r in requests}

    def release(self, request_ids):
        pass


def ms_per_step(engine: Engine, tokens: int, k: int = 0) -> tuple[float, dict[str, float]]:
    """One request of `tokens` output tokens, k drafts per step; (ms per step after the prefill step,
    mean ms per stage)."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, num_speculative_tokens=k)
    engine.add_request("a", list(range(1, PROMPT_LEN + 1)), params)
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


def graph_replay_ms(engine: Engine, width: int) -> float:
    """Median ms of one replay of the batch-1 graph of this width (the device's share of a step)."""
    graph, _ = engine.runner.graphs._graphs[(1, width)]
    return timed(graph.replay, iters=100)


def measure(model_dir: str, tokens: int, rounds: int, bandwidth: float) -> dict:
    config = EngineConfig(model=model_dir, device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=1 << 30,
                          max_num_seqs=8, max_model_len=4096, num_speculative_tokens=K, adaptive_drafting=False,
                          enable_prefix_caching=False)
    engine = Engine(config, FixedDrafts())
    ms_per_step(engine, 16)  # warm-up
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    row = {"model": Path(model_dir).name, "tokens": tokens, "floor": weight_bytes / bandwidth * 1e3}
    for _ in range(rounds):
        for mode in ("sync", "async"):
            engine.async_scheduling = mode == "async"
            row.setdefault(mode, []).append(ms_per_step(engine, tokens)[0])
        verify_ms, row["verify_stages"] = ms_per_step(engine, tokens, K)  # drafts: never scheduled ahead
        row.setdefault("verify", []).append(verify_ms)
    row["replay"], row["verify_replay"] = graph_replay_ms(engine, 1), graph_replay_ms(engine, K + 1)
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
    print(f"\n{card}, batch 1, prompt {PROMPT_LEN}, {args.tokens} tokens; ms per step (runs), floor = weights / copy BW")
    print("| model | floor | decode sync | decode async | decode replay | verify k=4 (sync) | verify replay "
          "| decode async / floor | verify / floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        runs = {key: " / ".join(f"{x:.3f}" for x in r[key]) for key in ("sync", "async", "verify")}
        print(f"| {r['model']} | {r['floor']:.3f} | {runs['sync']} | {runs['async']} | {r['replay']:.3f} | "
              f"{runs['verify']} | {r['verify_replay']:.3f} | {min(r['async']) / r['floor']:.2f}x | "
              f"{min(r['verify']) / r['floor']:.2f}x |")
    for r in rows:
        print(f"{r['model']} verify step, mean ms per stage: "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["verify_stages"].items()))


if __name__ == "__main__":
    main()
