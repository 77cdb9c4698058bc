"""The deterministic mode against the default one, in one run: is greedy text the same with and without
speculation, at k = 2 / 4 / 8, alone and among 63 other requests, seeded too, and run after run; and what does the
mode cost a step at batch 1 and at batch 64.

Usage: python -m bench.deterministic [--model default] [--device cuda] [--dtype bfloat16] [--num-prompts 12]
                                     [--max-tokens 128] [--modes default deterministic] [--out results.json]
Prompts: --num-prompts instruction prompts (bench/instruction_prompts.py) through the model's chat template, plus
as many others as make 64 for the batch runs. Every comparison is against the same mode's reference: each prompt
alone, one token a step (plain decoding). Step time is wall time over the steps of a run, after a short pass over
the same prompts has compiled whatever the kernels compile on first use: alone without drafts (batch 1) and all 64
at once without drafts (batch 64), and of each run's decode steps alone (those that only replayed CUDA graphs: none
on the CPU). Drafts come from the in-process n-gram drafter, drafting
at any batch size (--adaptive-drafting off), so the batch-64 runs verify drafts too.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from bench.instruction_prompts import instruction_prompts
from drafter_service.local import LocalProposer
from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner

BATCH = 64


def tokenize(model: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False) for text in instruction_prompts(count, max_chars=600)]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def generate(config: EngineConfig, runner, prompts: list[list[int]], params: SamplingParams, k: int = 0,
             together: bool = True) -> tuple[list[list[int]], float, int, list[float]]:
    """(each prompt's output, seconds, steps, the seconds of each step that only replayed decode / verify CUDA
    graphs): all prompts at once, or each alone."""
    engine = Engine(dataclasses.replace(config, num_speculative_tokens=k), runner=runner,
                    proposer=LocalProposer() if k else None)
    outputs: dict[str, list[int]] = {}
    steps, graph_steps, start = 0, [], time.perf_counter()
    for group in ([range(len(prompts))] if together else [[i] for i in range(len(prompts))]):
        for i in group:
            engine.add_request(str(i), prompts[i], params)
        while engine.has_unfinished_requests():
            began = time.perf_counter()
            for output in engine.step():
                outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
            steps += 1
            stats = engine.take_step_stats()
            if stats and all(s.forward_tokens and s.num_graph_replays == len(s.forward_tokens) for s in stats):
                graph_steps.append(time.perf_counter() - began)
    return [outputs[str(i)] for i in range(len(prompts))], time.perf_counter() - start, steps, graph_steps


def measure(config: EngineConfig, prompts: list[list[int]], count: int, max_tokens: int) -> dict:
    """One mode: its identical counts (of `count` prompts) per comparison and its step times."""
    greedy = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seeded = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, seed=11)
    mine = prompts[:count]
    runner = build_model_runner(config)
    generate(config, runner, mine, dataclasses.replace(greedy, max_tokens=8), together=False)  # JIT of any shape
    alone, seconds, steps, graph_steps = generate(config, runner, mine, greedy, together=False)
    result = {"step_ms_batch1": 1000 * seconds / steps, "step_ms_decode1": 1000 * sum(graph_steps) / len(graph_steps)
              if graph_steps else float("nan")}

    def same(outputs: list[list[int]]) -> int:
        return sum(a == b for a, b in zip(outputs, alone))

    result["k0_together"] = same(generate(config, runner, mine, greedy)[0])
    result["k4_alone"] = same(generate(config, runner, mine, greedy, 4, together=False)[0])
    for k in (2, 4, 8):
        result[f"k{k}_together"] = same(generate(config, runner, mine, greedy, k)[0])
    crowd, seconds, steps, graph_steps = generate(config, runner, prompts, greedy)
    result["among63_k0"], result["step_ms_batch64"] = same(crowd), 1000 * seconds / steps
    # the batch's decode steps alone (graph replays; none on the CPU), without its prompt chunks
    result["step_ms_decode64"] = 1000 * sum(graph_steps) / len(graph_steps) if graph_steps else float("nan")
    result["among63_k4"] = same(generate(config, runner, prompts, greedy, 4)[0])
    seeded_alone = generate(config, runner, mine, seeded, together=False)[0]
    result["seeded_k4_among63"] = sum(a == b for a, b in zip(generate(config, runner, prompts, seeded, 4)[0],
                                                            seeded_alone))
    del runner
    result["second_run_k4"] = same(generate(config, build_model_runner(config), mine, greedy, 4)[0])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["default", "deterministic"],
                        choices=("default", "deterministic"))
    parser.add_argument("--random-weights", action="store_true", help="the checkpoint's shapes, random weights")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    prompts = tokenize(args.model, BATCH)
    cuda = args.device == "cuda"
    base = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, block_size=256 if cuda else 16,
                        kv_cache_bytes=2 << 30 if cuda else 256 << 20, max_num_seqs=BATCH, adaptive_drafting=False,
                        max_speculative_tokens=8, random_weights=args.random_weights)
    results = {mode: measure(dataclasses.replace(base, deterministic=mode == "deterministic"), prompts,
                             args.num_prompts, args.max_tokens) for mode in args.modes}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    keys = [key for key in results[args.modes[0]] if not key.startswith("step_ms")]
    print(f"\n{args.model}, {args.dtype}, {args.num_prompts} prompts x {args.max_tokens} tokens: identical to each "
          "prompt alone without drafts")
    print("| mode | " + " | ".join(keys) + " | step ms, batch 1 | decode step ms, batch 1 | step ms, batch 64 | "
          "decode step ms, batch 64 |")
    print("|---" * (len(keys) + 5) + "|")
    for mode, result in results.items():
        cells = [f"{result[key]}/{args.num_prompts}" for key in keys]
        times = [result[key] for key in ("step_ms_batch1", "step_ms_decode1", "step_ms_batch64", "step_ms_decode64")]
        print(f"| {mode} | " + " | ".join(cells + [f"{ms:.3f}" for ms in times]) + " |")
    if len(results) == 2:
        default, deterministic = results["default"], results["deterministic"]
        ratios = ", ".join(f"{name} {deterministic[key] / default[key]:.2f}x" for name, key in
                           (("batch 1", "step_ms_batch1"), ("batch 1 decode steps", "step_ms_decode1"),
                            ("batch 64", "step_ms_batch64"),
                            ("batch 64 decode steps", "step_ms_decode64")))
        print(f"deterministic / default step time: {ratios}")


if __name__ == "__main__":
    main()
