"""Where in a run two engine configurations differ: `gpu_throughput.py --steps-out` lines, summed by phase.

Usage: python bench/step_phases.py STEPS.jsonl [--draft-batch 32]
Phases: prefill (steps feeding more tokens than twice their running requests: prompt chunks), full (more
running requests than --draft-batch: the draft policy holds drafts back), tail (the rest). Per configuration and
phase: steps, wall seconds (the sum of the stage seconds) and each stage's seconds, means over the runs in the file.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict


def phase(running: int, tokens: int, draft_batch: int) -> str:
    if tokens > 2 * max(running, 1):
        return "prefill"
    return "full" if running > draft_batch else "tail"


def summarise(lines: list[dict], draft_batch: int) -> dict[str, dict[str, list[float]]]:
    """config -> phase -> [steps, wall s, stage s...], averaged over the config's runs."""
    width = 2 + len(lines[0]["stages"])
    totals: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0] * width))
    runs: dict[str, int] = defaultdict(int)
    for line in lines:
        runs[line["config"]] += 1
        for running, tokens, _drafts, *seconds in line["steps"]:
            row = totals[line["config"]][phase(running, tokens, draft_batch)]
            for i, value in enumerate([1, sum(seconds), *seconds]):
                row[i] += value
    return {config: {name: [value / runs[config] for value in row] for name, row in sorted(phases.items())}
            for config, phases in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps")
    parser.add_argument("--draft-batch", type=int, default=32)
    args = parser.parse_args()
    lines = [json.loads(line) for line in open(args.steps) if line.strip()]
    stages = lines[0]["stages"]
    print("| config | phase | runs | steps | wall s | " + " | ".join(f"{s} s" for s in stages) + " |")
    print("|---" * (5 + len(stages)) + "|")
    runs = Counter(line["config"] for line in lines)
    for config, phases in summarise(lines, args.draft_batch).items():
        for name, row in phases.items():
            print(f"| {config} | {name} | {runs[config]} | {row[0]:.0f} | {row[1]:.3f} | "
                  + " | ".join(f"{s:.3f}" for s in row[2:]) + " |")


if __name__ == "__main__":
    main()
