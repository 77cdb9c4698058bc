"""What logprobs cost the verify step: verify-stage time per step with and without them, in one run.

A batch of greedy requests with n-gram drafts (the drafter's own store, in-process, memory off, so every run
drafts the same) decodes with the default model; the only difference between the runs is what the requests
ask for: nothing, logprobs 0 / 5 / 20 (raw), or 5 from the processed distribution (then sampled at
temperature 0.7, top-k 50). Runs alternate over --rounds so that drift hits all alike; the table gives the
median per step of the verify stage (rejection sampling, plus logprobs where asked), and of the forward
(score) for scale. Greedy output is the same in every raw run, so each does the same steps. --clock cpu (the
default) times the stages in this process's CPU seconds rather than wall seconds, so that other work on a
shared box does not blur the difference.

    .venv/bin/python bench/logprobs_cost.py [--device cpu] [--batch 8] [--k 4] [--max-tokens 48] [--rounds 5]
                                            [--clock cpu|wall]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from transformers import AutoTokenizer  # noqa: E402

from drafter_service.config import DrafterConfig  # noqa: E402
from drafter_service.local import LocalProposer  # noqa: E402
from specd.default_model import resolve_model_path  # noqa: E402
from verifier_service.engine import stats  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine, build_model_runner  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402

SOURCE = ("def merge(left, right):\n    result = []\n    while left and right:\n"
          "        result.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
          "    return result + left + right\n")
ASKS = {  # label -> SamplingParams fields besides max_tokens
    "no logprobs": {},
    "logprobs 0": dict(logprobs=0),
    "logprobs 5": dict(logprobs=5),
    "logprobs 20": dict(logprobs=20),
    "no logprobs, T=0.7 top-k 50": dict(temperature=0.7, top_k=50, seed=1),
    "processed 5, T=0.7 top-k 50": dict(temperature=0.7, top_k=50, seed=1, logprobs=5, logprobs_mode="processed"),
}


def prompts(batch: int) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    return [tokenizer(f"# Version {i}\n{SOURCE}\n# Repeat it exactly:\n{SOURCE[:40 + i]}")["input_ids"]
            for i in range(batch)]


def run(config: EngineConfig, runner, batch: list[list[int]], params: SamplingParams) -> tuple[float, float, int]:
    """(verify seconds per step, score seconds per step, steps) of decoding the batch."""
    engine = Engine(config, proposer=LocalProposer(DrafterConfig(memory_scope="off")), runner=runner)
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    steps = [s for s in engine.take_step_stats() if s.forward_tokens]
    per_step = lambda stage: sum(s.stage_seconds.get(stage, 0.0) for s in steps) / len(steps)  # noqa: E731
    return per_step("verify"), per_step("score"), len(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    if args.clock == "cpu":  # the engine's stage timer reads this process's CPU time instead
        stats.time = types.SimpleNamespace(perf_counter=time.process_time)
    config = EngineConfig(model="default", device=args.device, num_speculative_tokens=args.k,
                          max_speculative_tokens=args.k, enable_prefix_caching=False)
    runner = build_model_runner(config)
    batch = prompts(args.batch)
    results: dict[str, list[tuple[float, float, int]]] = {label: [] for label in ASKS}
    for label, fields in ASKS.items():  # warm-up: every code path once
        run(config, runner, batch[:2], SamplingParams(max_tokens=4, ignore_eos=True, **fields))
    for _ in range(args.rounds):
        for label, fields in ASKS.items():
            params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, **fields)
            results[label].append(run(config, runner, batch, params))
    print(f"device {args.device}, batch {args.batch}, k {args.k}, {args.max_tokens} tokens each, "
          f"median of {args.rounds} rounds, {args.clock} time")
    print("| requests ask for | steps | verify ms / step | score ms / step | verify vs its baseline |")
    print("|---|---|---|---|---|")
    for label, runs in results.items():
        verify, score = (statistics.median(r[i] for r in runs) * 1e3 for i in (0, 1))
        base_label = "no logprobs, T=0.7 top-k 50" if "T=0.7" in label else "no logprobs"
        base = statistics.median(r[0] for r in results[base_label]) * 1e3
        print(f"| {label} | {runs[0][2]} | {verify:.3f} | {score:.2f} | {verify - base:+.3f} ms ({verify / base:.2f}x) |")


if __name__ == "__main__":
    main()
