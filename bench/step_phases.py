"""Where in a run two engine configurations differ: `gpu_throughput.py --steps-out` lines, summed by phase.

Usage: python bench/step_phases.py STEPS.jsonl [--draft-batch 32]
Phases: prefill (steps feeding more tokens than twice their running requests: prompt chunks), full (more
running requests than --draft-batch: the draft policy holds drafts back), tail (the rest). Per configuration and
phase: steps, wall seconds (the sum of the stage seconds) and each stage's seconds, means over the runs in the file.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def phase(running: int, tokens: int, draft_batch: int) -> str:
    if tokens > 2 * max(running, 1):
        return "prefill"
    return "full" if running > draft_batch else "tail"


def summarise(lines: list[dict], draft_batch: int) -> dict[str, dict[str, list[float]]]:
    """config -> phase -> [steps, wall s, stage s...], averaged over the config's runs."""
    runs: dict[str, list[dict[str, list[float]]]] = defaultdict(list)
    for line in lines:
        stages = line["stages"]
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * (2 + len(stages)))
        for running, tokens, _drafts, *seconds in line["steps"]:
            row = sums[phase(running, tokens, draft_batch)]
            row[0] += 1
            row[1] += sum(seconds)
            for i, s in enumerate(seconds):
                row[2 + i] += s
        runs[line["config"]].append(sums)
    means = {}
    for config, config_runs in runs.items():
        phases = {p for r in config_runs for p in r}
        means[config] = {p: [sum(r[p][i] for r in config_runs if p in r) / len(config_runs)
                             for i in range(len(next(r[p] for r in config_runs if p in r)))] for p in sorted(phases)}
    return means


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps")
    parser.add_argument("--draft-batch", type=int, default=32)
    args = parser.parse_args()
    lines = [json.loads(line) for line in open(args.steps) if line.strip()]
    stages = lines[0]["stages"]
    print("| config | phase | runs | steps | wall s | " + " | ".join(f"{s} s" for s in stages) + " |")
    print("|---" * (5 + len(stages)) + "|")
    counts = defaultdict(int)
    for line in lines:
        counts[line["config"]] += 1
    for config, phases in summarise(lines, args.draft_batch).items():
        for name, row in phases.items():
            print(f"| {config} | {name} | {counts[config]} | {row[0]:.0f} | {row[1]:.3f} | "
                  + " | ".join(f"{s:.3f}" for s in row[2:]) + " |")


if __name__ == "__main__":
    main()
