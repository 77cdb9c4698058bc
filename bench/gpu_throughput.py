"""Throughput on nano-vllm's bench.py workload: 256 sequences, input and output lengths uniform in
[100, 1024], random token ids, temperature 0.6, ignore_eos; per engine configuration (see CONFIGS).

Usage: python -m bench.gpu_throughput MODEL_DIR [--eager] [--num-seqs 256] [--configs NAME,NAME,...]
       [--schedule async,sync,...] [--cprofile] [--kernels] [--steps-out FILE]
Throughput = output tokens / wall time of the whole run (prefill included), as nano-vllm counts it.
--schedule runs the workload once per entry on the same engine (one compile and capture), with async
scheduling on or off (engine.py), so the two can be compared on one host, alternating.
--steps-out appends one JSON line per run: every step's running requests, tokens, drafts and stage seconds, to
find where in the run (prefill, the full batch, the tail) two configurations differ.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time

import torch

from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from specd.sampling import SamplingParams
from verifier_service.engine.start_up_objects import freeze as freeze_start_up_objects
from verifier_service.engine.warm_up import warm_up

# name -> (speculation, EngineConfig changes); "always" = every decoding request drafts every step (round 1).
CONFIGS = {
    "eager-layers": (False, dict(compile_model=False)),
    "eager-layers+ngram-always": (True, dict(compile_model=False, adaptive_drafting=False)),
    "compiled": (False, dict(compile_model=True)),
    "compiled+ngram-always": (True, dict(compile_model=True, adaptive_drafting=False)),
    "compiled+ngram-adaptive": (True, dict(compile_model=True, adaptive_drafting=True)),
}


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


def measure(name: str, model: str, eager: bool, prompts, max_tokens, schedules: list[str],
            profile: bool = False, freeze: bool = True, kernels: bool = False,
            steps_out: str | None = None) -> list[dict]:
    speculation, changes = CONFIGS[name]
    config = EngineConfig(model=model, device="cuda", dtype="bfloat16", block_size=256, kv_cache_bytes=0,
                          kv_cache_memory_fraction=0.75, max_num_seqs=256, max_num_batched_tokens=16384,
                          max_model_len=4096, num_speculative_tokens=4 if speculation else 0,
                          enable_prefix_caching=False, enforce_eager=eager, **changes)
    proposer = None
    if speculation:
        from drafter_service.local import LocalProposer

        proposer = LocalProposer()
    started = time.perf_counter()
    engine = Engine(config, proposer)
    warm_up(engine)  # as the verifier does: the keyed sampler compiles for one row and for several here
    run(engine, [prompts[0][:100]], [16])  # and a prefill of the workload's kind
    load_s = time.perf_counter() - started
    if freeze:  # as the verifier does after its warm-up (verifier_service/server.py)
        freeze_start_up_objects()
    rows = []
    for schedule in schedules:
        engine.async_scheduling = schedule == "async"
        engine.take_step_stats()
        rows.append(measure_run(engine, f"{name}/{schedule}", prompts, max_tokens, profile, config.max_num_seqs,
                                steps_out))
        rows[-1]["load_compile_capture_s"] = load_s
        print(json.dumps(rows[-1]), flush=True)
    if kernels:  # one more run under the profiler: where the device time goes, and how long the device idles
        from bench.profile_step import print_kernel_table, profiled_kernels

        (seconds, produced), wall, table = profiled_kernels(run, engine, prompts, max_tokens)
        print(f"{name}: {produced / seconds:.0f} tok/s under the profiler")
        print_kernel_table(f"specd {name}, nano-vllm's workload", wall, table)
    del engine
    torch._dynamo.reset()  # compiled regions hold the model: free it before the next configuration
    gc.unfreeze()
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def measure_run(engine: Engine, name: str, prompts, max_tokens, profile: bool, max_num_seqs: int,
                steps_out: str | None = None) -> dict:
    if profile:  # where the host's time goes (cProfile slows Python code; read the ranking, not the totals)
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        seconds, produced = profiler.runcall(run, engine, prompts, max_tokens)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    else:
        with CollectionTimer() as collections:
            seconds, produced = run(engine, prompts, max_tokens)
    stats = engine.take_step_stats()
    spec = [s.spec_decoding for s in stats if s.spec_decoding]
    stages: dict[str, float] = {}
    for s in stats:
        for stage, stage_s in s.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + stage_s
    prefill = [s for s in stats if s.num_tokens > 2 * max_num_seqs]  # steps carrying prompt chunks
    if steps_out:
        write_steps(steps_out, name, stats)
    return {"config": name, "seconds": seconds, "output_tokens": produced, "tok_per_s": produced / seconds,
            "steps": len(stats), "steps_with_drafts": len(spec), "draft_tokens": sum(s.num_draft_tokens for s in spec),
            "accepted_tokens": sum(s.num_accepted_tokens for s in spec),
            "draft_skips": sum(s.num_draft_skips for s in stats),
            "preemptions": sum(s.num_preemptions for s in stats), "kv_blocks": engine.block_manager.num_blocks,
            "graphs": engine.runner.graphs is not None,
            "stage_seconds": {k: round(v, 3) for k, v in stages.items()},  # where the wall time went
            "prefill_steps": len(prefill),
            "prefill_seconds": round(sum(sum(s.stage_seconds.values()) for s in prefill), 3),
            "gc_seconds": round(collections.seconds, 3) if not profile else None,
            "gc_full_collections": collections.full if not profile else None}


def write_steps(path: str, name: str, stats) -> None:
    """One JSON line: per step [running after it, tokens fed, draft tokens, seconds per stage (STAGES order)]."""
    from verifier_service.engine.stats import STAGES

    steps = [[s.num_running, s.num_tokens, s.spec_decoding.num_draft_tokens if s.spec_decoding else 0,
              *(round(s.stage_seconds.get(stage, 0.0), 6) for stage in STAGES)] for s in stats]
    with open(path, "a") as out:
        out.write(json.dumps({"config": name, "stages": STAGES, "steps": steps}) + "\n")


class CollectionTimer:
    """Time the run spends in Python's garbage collector (gc.callbacks), and its full collections."""

    def __enter__(self):
        self.seconds, self.full, self._started = 0.0, 0, 0.0
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info["generation"] == 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--schedule", default="async", help="async / sync per run of each config, e.g. async,sync")
    parser.add_argument("--cprofile", action="store_true", help="print the host's hottest functions per config")
    parser.add_argument("--kernels", action="store_true", help="one more run per config under torch's profiler: "
                        "device busy / wall and the kernels that take the time (bench/profile_step.py)")
    parser.add_argument("--steps-out", help="append every run's per-step stats to this file (JSON lines)")
    parser.add_argument("--no-gc-freeze", action="store_true", help="skip the verifier's gc.freeze() after warm-up")
    args = parser.parse_args()
    prompts, max_tokens = workload(args.num_seqs)
    schedules = args.schedule.split(",")
    rows = [row for name in args.configs.split(",")
            for row in measure(name, args.model, args.eager, prompts, max_tokens, schedules, args.cprofile,
                               not args.no_gc_freeze, args.kernels, args.steps_out)]
    card = torch.cuda.get_device_name()
    print(json.dumps({"card": card, "rows": rows}, indent=1))
    print(f"\n{card}, {args.num_seqs} seqs, {'eager' if args.eager else 'CUDA graphs'}")
    print("| config | output tokens | seconds | tok/s | steps | steps with drafts | accepted / drafted "
          "| vs nano-vllm H200 14,943 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['output_tokens']} | {r['seconds']:.2f} | {r['tok_per_s']:.0f} | {r['steps']} | "
              f"{r['steps_with_drafts']} | {r['accepted_tokens']} / {r['draft_tokens']} | "
              f"{r['tok_per_s'] / 14943:.2f}x |")


if __name__ == "__main__":
    main()
