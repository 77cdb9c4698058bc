"""Engine tokens/s with speculation off, with the drafter before its memory (plain prompt lookup) and with
the drafter (evidence and memory), next to Hugging Face generate with and without prompt lookup, on the
same prompts and model, batch 1, in one run (CPU by default).

Usage: python -m bench.engine [--num-prompts 8] [--max-tokens 128] [--k 8] [--device cpu]
                              [--workload humaneval|repeat-code|self-refine|extract] [--adaptive-drafting on|off]
                              [--dtype float32|bfloat16] [--deterministic]
Prompts: by default third-party code (HumanEval, or standard-library sources) that the prompt asks to
repeat, so n-gram drafts hit, as they do in everyday "fix / repeat this code" requests, with
--max-tokens new tokens each (EOS ignored). The other workloads are bench/acceptance.py's
recorded requests, decoded to their recorded length (or EOS), so outputs can be checked against the
recording. The drafters run in-process on the drafter's own store (drafter_service/local.py); the
drafter's memory fills as the prompts go by, as a running service's would. --adaptive-drafting off lifts
the draft policy's batch-size limit (at batch 1 both draft on every step: the engine no longer backs a
request off after rejections; the drafter's evidence decides how many slots it fills).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.acceptance import load_or_record
from bench.workload import WORKLOADS
from bench.workload import prompts as workload_prompts
from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from specd.default_model import resolve_model_path
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner
from specd.sampling import SamplingParams


STEPS: dict[int, int] = {}  # per engine (id): steps that emitted tokens, for tokens per step


def run_engine(engine: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    engine.add_request("bench", prompt, params)
    output: list[int] = []
    while engine.has_unfinished_requests():
        for step_output in engine.step():
            output += step_output.new_token_ids
            STEPS[id(engine)] = STEPS.get(id(engine), 0) + 1
    return output


def run_hf(model, prompt: list[int], params: SamplingParams, lookup: int) -> list[int]:
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.inference_mode():
        input_ids = torch.tensor([prompt])
        generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                   max_new_tokens=params.max_tokens, pad_token_id=0,
                                   eos_token_id=list(params.stop_token_ids) or None, **extra)
    return generated[0, len(prompt):].tolist()


def measure(methods: dict, requests: list[tuple[list[int], SamplingParams]]) -> dict[str, tuple[float, float, list]]:
    """(tokens per wall second, tokens per CPU second of this process, outputs) per method; methods take turns
    on each prompt so load drift hits all alike. CPU time leaves out waiting for a core, which on a shared
    machine moves wall time by more than the differences measured."""
    for generate in methods.values():
        generate(requests[0][0][:32], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up: first-call costs
    seconds = {name: [0.0, 0.0] for name in methods}
    outputs: dict[str, list[list[int]]] = {name: [] for name in methods}
    for prompt, params in requests:
        for name, generate in methods.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            outputs[name].append(generate(prompt, params))
            seconds[name][0] += time.perf_counter() - started
            seconds[name][1] += time.process_time() - started_cpu
    return {name: (sum(map(len, outputs[name])) / wall, sum(map(len, outputs[name])) / cpu, outputs[name])
            for name, (wall, cpu) in seconds.items()}


def bench_requests(args, tokenizer) -> tuple[str, list[tuple[list[int], SamplingParams]], list[list[int]] | None]:
    """(description, (prompt, params) per request, recorded outputs or None) of the chosen workload."""
    if args.workload == "humaneval":
        source, texts = workload_prompts(args.num_prompts)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        return (f"{source}, {args.max_tokens} new tokens each",
                [(tokenizer(text)["input_ids"], params) for text in texts], None)
    recordings = load_or_record(args.workload, WORKLOADS[args.workload](), 256)[:args.num_prompts]
    stop = (tokenizer.eos_token_id,)
    return (f"{args.workload} (bench/acceptance.py's recordings), to the recorded length or EOS",
            [(r.prompt_token_ids, SamplingParams(max_tokens=len(r.output_token_ids), stop_token_ids=stop))
             for r in recordings], [r.output_token_ids for r in recordings])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="drafts per step for our engine")
    parser.add_argument("--hf-lookup", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workload", default="humaneval", choices=["humaneval", *WORKLOADS])
    parser.add_argument("--adaptive-drafting", default="on", choices=("on", "off"))
    parser.add_argument("--skip-hf", action="store_true", help="only the engine's methods")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--deterministic", action="store_true",
                        help="also the engine in the deterministic mode (batch-invariant kernels), off and drafting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = resolve_model_path("default")
    tokenizer = AutoTokenizer.from_pretrained(path)
    description, requests, recorded = bench_requests(args, tokenizer)
    config = EngineConfig(model="default", device=args.device, dtype=args.dtype, num_speculative_tokens=args.k,
                          adaptive_drafting=args.adaptive_drafting == "on")
    runner = build_model_runner(config)
    methods = {}
    if not args.skip_hf:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval()
        methods["HF generate"] = lambda p, params: run_hf(model, p, params, 0)
        methods[f"HF generate, prompt lookup {args.hf_lookup}"] = lambda p, params: run_hf(model, p, params, args.hf_lookup)
    engines = {}
    for name, proposer in [("specd engine, no speculation", None),
                           (f"specd engine, n-gram k={args.k} (before)",
                            LocalProposer(DrafterConfig(drafting="ngram", memory_scope="off"))),
                           (f"specd engine, drafter k={args.k}", LocalProposer(DrafterConfig()))]:
        engine = engines[name] = Engine(config, proposer=proposer, runner=runner)
        methods[name] = lambda p, params, engine=engine: run_engine(engine, p, params)
    if args.deterministic:
        deterministic = dataclasses.replace(config, deterministic=True)
        deterministic_runner = build_model_runner(deterministic)
        for name, proposer in [("deterministic, no speculation", None),
                               (f"deterministic, drafter k={args.k}", LocalProposer(DrafterConfig()))]:
            engine = engines[name] = Engine(deterministic, proposer=proposer, runner=deterministic_runner)
            methods[name] = lambda p, params, engine=engine: run_engine(engine, p, params)
    results = measure(methods, requests)
    lengths = [len(p) for p, _ in requests]
    print(f"workload: {description}; {len(requests)} prompts of {min(lengths)}-{max(lengths)} tokens, batch 1, "
          f"{args.device}, {args.threads} threads, {args.dtype}, adaptive drafting {args.adaptive_drafting}")
    reference_name = "HF generate" if not args.skip_hf else "specd engine, no speculation"
    reference = results[reference_name][2]
    baseline_name = f"HF generate, prompt lookup {args.hf_lookup}" if not args.skip_hf else reference_name
    _, baseline, _ = results[baseline_name]
    print(f"speed vs {baseline_name} (by CPU time); same tokens as {'the recording' if recorded else reference_name}")
    print(f"{'':42s} {'tok/s wall':>10s} {'tok/s CPU':>10s} {'speed':>8s} {'same tokens':>12s} {'tok/step':>9s}")
    for name, (speed, cpu_speed, outputs) in results.items():
        same = sum(a == b for a, b in zip(outputs, recorded or reference))
        steps = STEPS.get(id(engines.get(name)))  # warm-up steps included: 8 tokens each
        per_step = f"{(sum(map(len, outputs)) + 8) / steps:9.2f}" if steps else ""
        print(f"{name:42s} {speed:10.1f} {cpu_speed:10.1f} {cpu_speed / baseline:7.2f}x {same:>9d}/{len(requests)} "
              f"{per_step}")


if __name__ == "__main__":
    main()
