"""Seeded sampling is reproducible: the same (prompt, seed) gives the same tokens however the engine runs it,
and what the keyed sampler costs next to the one it replaced.

Usage: python bench/seeded_sampling.py [--num-prompts 20] [--seeds 3] [--max-tokens 24] [--temperature 1.0]

Part 1: num-prompts x seeds sampled requests (the default model in float32 on the CPU, engine-level, the
drafter's n-gram store in process), decoded once per variant. The reference decodes each request alone,
without speculation, synchronously, without the prefix cache; every other variant is compared with it
token for token: alone with drafts, 8 at a time (continuous batching, max_num_seqs 8) without drafts and
with k = 2 / 4 / 8, with async scheduling, from the prefix cache (each request run a second time in the
same engine), and with a KV cache so small that requests are preempted and recomputed.

Part 2: the verify stage (SamplingMetadata.build + verify, the result copied to the host) on one sampled
batch of 8 requests with 0 / 4 / 8 drafts each, vocabulary 49152, without and with top-p, with the keyed
sampler and with the sampler it replaced (its randomness - a uniform per row and an exponential per row and
token, from each request's torch.Generator when seeded, else the global generator - kept here, in
_previous_judge_rows, for this comparison only). All time the same calls on the same logits, taking turns,
in the same process; the minimum is the figure least disturbed by other work on a shared machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from drafter_service.config import DrafterConfig  # noqa: E402
from drafter_service.local import LocalProposer  # noqa: E402
from specd.default_model import resolve_model_path  # noqa: E402
from support.engine_runs import run  # noqa: E402
from verifier_service.engine import rejection_sampler  # noqa: E402
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest  # noqa: E402
from verifier_service.engine.config import EngineConfig  # noqa: E402
from verifier_service.engine.engine import Engine, build_model_runner  # noqa: E402
from verifier_service.engine.request import Request  # noqa: E402
from verifier_service.engine.sampling import target_scores  # noqa: E402
from verifier_service.engine.sampling_metadata import SamplingMetadata  # noqa: E402
from verifier_service.engine.sampling_params import SamplingParams  # noqa: E402
from workload import prompts as workload_prompts  # noqa: E402

KV_BLOCK_BYTES = 2 * 30 * 3 * 64 * 16 * 4  # the default model's 16-token block in float32 (K and V, 30 layers)
logging.getLogger("verifier_service.engine.context_length").setLevel(logging.ERROR)  # the cache-capped context
BASE = EngineConfig(model="default", device="cpu", dtype="float32", enable_prefix_caching=False,
                    num_speculative_tokens=0, async_scheduling=False)


def decode(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    return run(engine)


def variants(runner, small_runner) -> dict[str, tuple]:
    """name -> (runner, config, k or None for no proposer, how the requests go in: "alone" one at a time,
    "together" all at once, "twice" all at once and then again in the same engine, the second run compared)."""
    batched = dataclasses.replace(BASE, max_num_seqs=8)
    return {
        "alone, k=4": (runner, BASE, 4, "alone"),
        "8 concurrent, speculation off": (runner, batched, None, "together"),
        "8 concurrent, k=2": (runner, batched, 2, "together"),
        "8 concurrent, k=4": (runner, batched, 4, "together"),
        "8 concurrent, k=8": (runner, batched, 8, "together"),
        "8 concurrent, k=4, async scheduling": (runner, dataclasses.replace(batched, async_scheduling=True), 4,
                                                "together"),
        "8 concurrent, k=4, prefix cache hits": (runner, dataclasses.replace(batched, enable_prefix_caching=True),
                                                 4, "twice"),
        "8 concurrent, k=4, preemption": (small_runner, batched, 4, "together"),
    }


def run_variant(runner, config: EngineConfig, k: int | None, mode: str, requests) -> tuple[dict, dict]:
    """Outputs by request id, and what happened: drafts accepted / scored, preemptions, tokens computed."""
    proposer = LocalProposer(DrafterConfig(memory_scope="off")) if k is not None else None
    engine = Engine(dataclasses.replace(config, num_speculative_tokens=k or 0), proposer=proposer, runner=runner)
    if mode == "twice":
        decode(engine, requests)
        engine.take_step_stats()
    if mode == "alone":
        outputs = {rid: decode(engine, {rid: request})[rid] for rid, request in requests.items()}
    else:
        outputs = decode(engine, requests)
    stats = engine.take_step_stats()
    spec = [s.spec_decoding for s in stats if s.spec_decoding]
    return outputs, {"accepted": sum(s.num_accepted_tokens for s in spec),
                     "drafts": sum(s.num_draft_tokens for s in spec),
                     "preemptions": sum(s.num_preemptions for s in stats),
                     "computed": sum(s.num_tokens for s in stats),
                     "ahead": sum(s.scheduled_ahead for s in stats)}


def reproducibility(args, tokenizer) -> None:
    source, texts = workload_prompts(args.num_prompts, max_chars=args.max_chars)
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    requests = {f"p{p}s{s}": (prompt, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                                     top_p=args.top_p, seed=s, ignore_eos=True))
                for p, prompt in enumerate(prompts) for s in range(args.seeds)}
    runner = build_model_runner(dataclasses.replace(BASE, kv_cache_bytes=64 << 20))
    longest = max(map(len, prompts)) + args.max_tokens
    small_blocks = 2 * (-(-longest // 16)) + 2  # two requests' worth: eight at a time must preempt
    small_runner = build_model_runner(dataclasses.replace(BASE, kv_cache_bytes=small_blocks * KV_BLOCK_BYTES))
    print(f"{len(prompts)} prompts ({source}, {min(map(len, prompts))}-{max(map(len, prompts))} tokens) x "
          f"{args.seeds} seeds, {args.max_tokens} tokens each, temperature {args.temperature}, top_p {args.top_p}; "
          f"default model, CPU, float32, {torch.get_num_threads()} threads")
    started = time.perf_counter()
    reference = {rid: decode(Engine(BASE, runner=runner), {rid: request})[rid] for rid, request in requests.items()}
    print(f"reference (each alone, no speculation, synchronous, no prefix cache): {time.perf_counter() - started:.0f} s")
    distinct = len({tuple(out) for out in reference.values()})
    print(f"  {distinct} distinct outputs of {len(reference)} (seeds do differ)")
    print(f"{'variant':40s} {'identical':>12s} {'accepted/drafts':>16s} {'preempt':>8s} {'computed':>9s} "
          f"{'ahead':>6s} {'seconds':>8s}")
    for name, (variant_runner, config, k, mode) in variants(runner, small_runner).items():
        started = time.perf_counter()
        outputs, counts = run_variant(variant_runner, config, k, mode, requests)
        same = sum(outputs[rid] == reference[rid] for rid in requests)
        print(f"{name:40s} {same:>4d}/{len(requests)} {100 * same / len(requests):4.0f}% "
              f"{counts['accepted']:>7d}/{counts['drafts']:<8d} {counts['preemptions']:>8d} {counts['computed']:>9d} "
              f"{counts['ahead']:>6d} {time.perf_counter() - started:8.0f}")


# -- part 2: the sampler's cost ------------------------------------------------------------------------------

def _previous_judge_rows(logits: torch.Tensor, metadata: SamplingMetadata, generators: list) -> tuple:
    """The rejection sampler's judgement before keyed sampling (kept for this comparison only)."""
    num_rows, vocab = logits.shape
    target_argmax = logits.argmax(dim=-1)
    greedy_accepted = metadata.row_draft == target_argmax
    scores = target_scores(logits, metadata.row_temperature, metadata.row_top_k, metadata.row_top_p,
                           metadata.row_min_p, (metadata.use_top_k, metadata.use_top_p, metadata.use_min_p))
    probs = scores.softmax(dim=-1)
    row_has_draft = torch.ones(num_rows, dtype=torch.bool)
    row_has_draft[metadata.row_index[:, -1]] = False
    uniform = torch.rand(num_rows)
    exponential = torch.empty(num_rows, vocab).exponential_()
    for first, count, generator in generators:
        uniform[first:first + count] = torch.rand(count, generator=generator)
        exponential[first:first + count].exponential_(generator=generator)
    if metadata.draft_mask.any():
        draft_prob = probs.gather(1, metadata.row_draft.unsqueeze(1)).squeeze(1)
        sampled_accepted = row_has_draft & (uniform < draft_prob)
        residual = probs.scatter(1, metadata.row_draft.unsqueeze(1), 0.0)
        residual = torch.where(row_has_draft.unsqueeze(1), residual, probs)
        residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, probs)
    else:
        sampled_accepted, residual = row_has_draft, probs
    sampled = (residual / exponential).argmax(dim=-1)
    greedy = metadata.row_greedy
    return torch.where(greedy, greedy_accepted, sampled_accepted), torch.where(greedy, target_argmax, sampled)


def sampled_batch(num_drafts: int, top_p: float, vocab: int = 49152):
    """8 seeded sampled requests with num_drafts drafts each: (logits, batch, requests, their generators as the
    previous sampler kept them: (first row, row count, generator))."""
    params = SamplingParams(max_tokens=64, temperature=0.8, top_p=top_p, seed=7)
    requests = [Request(f"r{i}", [1] * 100, params, i) for i in range(8)]
    batch = ScheduledBatch([ScheduledRequest(r.request_id, [5] * (num_drafts + 1), 100 + 3 * i, [0], num_drafts,
                                             num_drafts + 1) for i, r in enumerate(requests)])
    logits = 4 * torch.randn(8 * (num_drafts + 1), vocab, generator=torch.Generator().manual_seed(num_drafts))
    generators = [(i * (num_drafts + 1), num_drafts + 1, torch.Generator().manual_seed(7 + i)) for i in range(8)]
    return logits, batch, requests, generators


def timed_verify(logits, batch, requests, judge) -> float:
    """ms of one verify stage (SamplingMetadata.build + verify, result on the host) with `judge` as the
    sampler's judgement."""
    original = rejection_sampler._judge_rows
    rejection_sampler._judge_rows = judge
    try:
        started = time.perf_counter()
        rejection_sampler.verify(logits, SamplingMetadata.build(batch, requests, logits.device))
        return 1000 * (time.perf_counter() - started)
    finally:
        rejection_sampler._judge_rows = original


def sampler_cost(repeats: int) -> None:
    print(f"\nverify stage, 8 sampled requests, temperature 0.8, vocabulary 49152: ms, min / median of {repeats} "
          "calls each, taking turns")
    print("before = the previous sampler (unseeded: the global generator; seeded: each request's torch.Generator); "
          "after = keyed (one rule)")
    print(f"{'drafts':>6s} {'top_p':>6s} {'before, unseeded':>18s} {'before, seeded':>16s} {'after':>16s} "
          f"{'after/before':>13s}")
    for top_p in (1.0, 0.95):
        for num_drafts in (0, 4, 8):
            logits, batch, requests, generators = sampled_batch(num_drafts, top_p)
            judges = {"unseeded": lambda lg, md: _previous_judge_rows(lg, md, []),
                      "seeded": lambda lg, md, g=generators: _previous_judge_rows(lg, md, g),
                      "keyed": rejection_sampler._judge_rows}
            times = {name: [] for name in judges}
            for _ in range(repeats):  # taking turns, so load drift hits all alike
                for name, judge in judges.items():
                    times[name].append(timed_verify(logits, batch, requests, judge))
            cells = {name: f"{min(t):7.1f} / {statistics.median(t):6.1f}" for name, t in times.items()}
            ratio = min(times["keyed"]) / min(min(times["unseeded"]), min(times["seeded"]))
            print(f"{num_drafts:>6d} {top_p:>6.2f} {cells['unseeded']:>18s} {cells['seeded']:>16s} "
                  f"{cells['keyed']:>16s} {ratio:12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-chars", type=int, default=500, help="longest code snippet a prompt shows")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20, help="verify calls timed per case and sampler")
    parser.add_argument("--skip-reproducibility", action="store_true", help="only part 2 (the sampler's cost)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_reproducibility:
        reproducibility(args, AutoTokenizer.from_pretrained(resolve_model_path("default")))
    sampler_cost(args.repeats)


if __name__ == "__main__":
    main()
