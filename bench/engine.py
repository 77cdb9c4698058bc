"""Engine tokens/s with speculation on and off, next to Hugging Face generate with and without
prompt lookup, on the same prompts and model, batch 1, in one run (CPU by default).

Usage: python bench/engine.py [--num-prompts 8] [--max-tokens 128] [--k 8] [--device cpu]
Prompts: third-party code (HumanEval, or standard-library sources) that the prompt asks to repeat, so
n-gram drafts hit, as they do in everyday "fix / repeat this code" requests.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from drafter_service.config import DrafterConfig  # noqa: E402
from drafter_service.local import LocalProposer  # noqa: E402
from specd.default_model import resolve_model_path  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine, build_model_runner  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402
from workload import prompts as workload_prompts  # noqa: E402


def ngram_proposer(min_ngram: int, max_ngram: int) -> LocalProposer:
    """The drafter's own incremental n-gram index, in process (no RPC)."""
    return LocalProposer(DrafterConfig(min_ngram=min_ngram, max_ngram=max_ngram))


def run_engine(engine: Engine, prompt: list[int], max_tokens: int) -> list[int]:
    engine.add_request("bench", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    output: list[int] = []
    while engine.has_unfinished_requests():
        for step_output in engine.step():
            output += step_output.new_token_ids
    return output


def run_hf(model, prompt: list[int], max_tokens: int, lookup: int) -> list[int]:
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.inference_mode():
        input_ids = torch.tensor([prompt])
        generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                   max_new_tokens=max_tokens, pad_token_id=0, **extra)
    return generated[0, len(prompt):].tolist()


def measure(methods: dict, prompts: list[list[int]]) -> dict[str, tuple[float, list[list[int]]]]:
    """tokens/s and outputs per method; methods take turns on each prompt so load drift hits all alike."""
    for generate in methods.values():
        generate(prompts[0][:32])  # warm-up: first-call costs stay out of the numbers
    seconds = dict.fromkeys(methods, 0.0)
    outputs: dict[str, list[list[int]]] = {name: [] for name in methods}
    for prompt in prompts:
        for name, generate in methods.items():
            started = time.perf_counter()
            outputs[name].append(generate(prompt))
            seconds[name] += time.perf_counter() - started
    return {name: (sum(map(len, outputs[name])) / seconds[name], outputs[name]) for name in methods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="drafts per step for our engine")
    parser.add_argument("--hf-lookup", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = resolve_model_path("default")
    source, texts = workload_prompts(args.num_prompts)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    config = EngineConfig(model="default", device=args.device, dtype="float32", num_speculative_tokens=args.k)
    runner = build_model_runner(config)
    spec_engine = Engine(config, proposer=ngram_proposer(config.min_ngram, config.max_ngram), runner=runner)
    plain_engine = Engine(config, runner=runner)  # no proposer: no drafts
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    model.generation_config.eos_token_id = None  # fixed-length outputs, as ignore_eos does in the engine

    n = args.max_tokens
    results = measure({
        "HF generate": lambda p: run_hf(model, p, n, 0),
        f"HF generate, prompt lookup {args.hf_lookup}": lambda p: run_hf(model, p, n, args.hf_lookup),
        "specd engine, no speculation": lambda p: run_engine(plain_engine, p, n),
        f"specd engine, n-gram k={args.k}": lambda p: run_engine(spec_engine, p, n),
    }, prompts)
    print(f"workload: {source}, {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {n} new tokens each, batch 1, {args.device}, {args.threads} threads, float32")
    print(f"{'':38s} {'tok/s':>8s} {'vs HF lookup':>13s} {'same tokens as HF':>18s}")
    (_, reference), (lookup_speed, _) = list(results.values())[:2]
    for name, (speed, outputs) in results.items():
        same = sum(a == b for a, b in zip(outputs, reference))
        print(f"{name:38s} {speed:8.1f} {speed / lookup_speed:12.2f}x {same:>12d}/{len(prompts)}")


if __name__ == "__main__":
    main()
