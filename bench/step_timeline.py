"""The engine's own loop, step by step, at one request or a batch: what a step costs beyond its forward's kernels.

    python -m bench.step_timeline [--model DIR] [--device cuda] [--ks 0 4] [--batch 1 16] [--steps 300] \
        [--out timeline.json] [-- VERIFIER OPTIONS]

For each batch size and k, that many requests (instruction prompts, greedy, ignore_eos, long enough for every step
timed) run at once in the
engine as the verifier builds it (its engine config from `specd verifier`'s defaults: CUDA graphs and async
scheduling on the GPU; the drafter's rule in process, memory off). After a warm-up, `--steps` steps are timed:
- on the host, each engine stage's time (perf_counter around the engine's methods; `collect` is the wait for the
  step's tokens, the only place the host waits for the device);
- on the device, CUDA events on the stream around each step's launch: the device's span per step (its inputs' copies
  and its graph) and its idle time between one step's end and the next step's start.
No profiler runs (CUPTI's kernel tracing of graph replays doubled the step time). An idle device means the host is
the bottleneck, by the stages that grew; a host waiting in `collect` means the device is. On the CPU it runs too
(host columns only), as a check of the tool.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch

STAGES = ("_schedule", "_propose", "_collect_ahead", "_ask_ahead", "_launch", "_collect", "_update")


def prompt_ids(model: str, count: int = 1) -> list[list[int]]:
    from bench.instruction_prompts import instruction_prompts
    from gateway.tokenizer import Tokenizer
    from specd.default_model import resolve_model_path

    tokenizer = Tokenizer(resolve_model_path(model))
    return [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in instruction_prompts(count)]


class Timers:
    """Host seconds per engine stage, and CUDA events around each launch (`wrap` puts them on an engine)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.events: list[tuple] = []  # (before, after, context length) of each step's launch on the device
        self.on = False

    def wrap(self, engine) -> None:
        """Each engine stage's calls timed (instance attributes shadow the methods)."""
        for name in STAGES:
            setattr(engine, name, self._timed(name, getattr(engine, name)))

    def _timed(self, name: str, method):
        cuda = torch.cuda.is_available()

        def stage(*args, **kwargs):
            if not self.on:
                return method(*args, **kwargs)
            if cuda and name == "_launch":
                before = torch.cuda.Event(enable_timing=True)
                before.record()
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name.lstrip("_")] += time.perf_counter() - started
                if cuda and name == "_launch":
                    after = torch.cuda.Event(enable_timing=True)
                    after.record()
                    self.events.append((before, after, max(r.context_len for r in args[0].requests)))
        return stage

    def device_ms(self) -> dict:
        """The device's span per launch and idle time between one launch's end and the next's start (ms a step), and
        the span fitted over the context length: at 512 keys, and its growth per 1,000 keys (a verify step's context
        grows faster than a decode step's, so their spans compare at one length)."""
        torch.cuda.synchronize()
        spans = [before.elapsed_time(after) for before, after, _ in self.events]
        idle = [max(0.0, a[1].elapsed_time(b[0])) for a, b in zip(self.events, self.events[1:])]
        contexts = [context for _, _, context in self.events]
        slope, intercept = np.polyfit(contexts, spans, 1)
        return {"device_ms": float(np.mean(spans)), "device_idle_ms": sum(idle) / len(spans),
                "device_ms_at_512": float(intercept + 512 * slope), "device_ms_per_1k_keys": float(1000 * slope),
                "contexts": [min(contexts), max(contexts)]}


def run_steps(engine, steps: int) -> tuple[float, int]:
    """(wall seconds, output tokens) of `steps` engine steps."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    started, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    sync()
    return time.perf_counter() - started, tokens


def measure(engine, timers: Timers, prompts: list[list[int]], k: int, steps: int, warm: int = 30) -> dict:
    from specd.sampling import SamplingParams

    request_ids = [f"timeline-k{k}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(request_ids, prompts):
        engine.add_request(request_id, prompt, SamplingParams(
            max_tokens=(warm + steps) * (k + 1) + 64, ignore_eos=True, num_speculative_tokens=k))
    run_steps(engine, warm)
    timers.seconds.clear()
    timers.events.clear()
    timers.on = True
    wall, tokens = run_steps(engine, steps)
    timers.on = False
    row = {"batch": len(prompts), "k": k, "steps": steps, "wall_ms": 1e3 * wall / steps,
           "tokens": tokens / steps / len(prompts),
           "stage_ms": {name: 1e3 * seconds / steps for name, seconds in timers.seconds.items()}}
    row["stage_ms"]["rest"] = row["wall_ms"] - sum(row["stage_ms"].values())  # the loop's own, between stages
    if torch.cuda.is_available():
        row.update(timers.device_ms())
    for request_id in request_ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return row


def print_table(rows: list[dict]) -> None:
    names = [name.lstrip("_") for name in STAGES if any(name.lstrip("_") in r["stage_ms"] for r in rows)] + ["rest"]
    print("| batch | k | tokens / step a request | wall ms / step | device span ms | device idle ms | span at 512 keys, + per 1k "
          "| keys | host ms / step: " + ", ".join(names) + " |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stages = " / ".join(f"{r['stage_ms'].get(name, 0):.3f}" for name in names)
        print(f"| {r['batch']} | {r['k']} | {r['tokens']:.2f} | {r['wall_ms']:.3f} | {r.get('device_ms', 0):.3f} "
              f"| {r.get('device_idle_ms', 0):.3f} | {r.get('device_ms_at_512', 0):.3f}, "
              f"+{r.get('device_ms_per_1k_keys', 0):.3f} | {'-'.join(map(str, r.get('contexts', [])))} | {stages} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="requests at once (each size a run per k)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="timeline.json")
    parser.add_argument("verifier_args", nargs="*", help="more `specd verifier` options, after --")
    args = parser.parse_args()
    started = time.perf_counter()
    from bench.stack import verifier_engine

    engine = verifier_engine(["--model", args.model, "--device", args.device, *args.verifier_args])
    timers = Timers()
    print(f"engine built and warmed up in {time.perf_counter() - started:.1f} s", flush=True)
    timers.wrap(engine)
    prompts = prompt_ids(args.model, max(args.batch))
    rows = [measure(engine, timers, prompts[:batch], k, args.steps) for batch in args.batch for k in args.ks]
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print_table(rows)


if __name__ == "__main__":
    main()
