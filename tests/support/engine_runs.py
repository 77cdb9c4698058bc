"""Driving an Engine in tests: step it to the end, greedy generation, and the near-tie measure.

Shared by the CPU engine tests (fake and real runners) and the GPU tests.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import torch

from drafter_service.local import LocalProposer
from specd.sampling import SamplingParams
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine


def run(engine: Engine) -> dict[str, list[int]]:
    """Step until done; returns each request's whole output, checking nothing follows a finish."""
    outputs: dict[str, list[int]] = {}
    finished: set[str] = set()
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert output.request_id not in finished
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.finished:
                finished.add(output.request_id)
    return outputs


def generate_each(config: EngineConfig, runner, prompts: Sequence[list[int]], params: SamplingParams, k: int = 0,
                  together: bool = True, engine: Engine | None = None) -> list[list[int]]:
    """Every prompt's output, in order: all at once, or each alone (one request in the engine at a time), from an
    Engine of config and runner with k drafts a step from the in-process drafter (or from `engine`). Checks that
    no KV block is left in use."""
    engine = engine or Engine(dataclasses.replace(config, num_speculative_tokens=k), runner=runner,
                              proposer=LocalProposer() if k else None)
    outputs = {}
    for group in ([range(len(prompts))] if together else [[i] for i in range(len(prompts))]):
        for i in group:
            engine.add_request(str(i), prompts[i], params)
        outputs |= run(engine)
    assert engine.block_manager.num_used_blocks == 0
    return [outputs[str(i)] for i in range(len(prompts))]


def generate_greedy(engine: Engine, prompts: Sequence[list[int]], max_tokens: int) -> dict[str, list[int]]:
    """Every prompt at once as request r{i}, greedy, ignore_eos, max_tokens each; outputs by request id."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return run(engine)


def top2_gap(runner, tokens: list[int], block_size: int) -> float:
    """Top-1 minus top-2 logit after `tokens` (one eager prefill on the runner's first blocks)."""
    table = list(range(-(-len(tokens) // block_size)))
    logits = runner.execute(ScheduledBatch([ScheduledRequest("gap", tokens, 0, table, 0, 1)]))[0]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def argmax_agreement(runner, model_dir, tokens: list[int], block_size: int) -> float:
    """The share of a prompt's positions where the runner's argmax (one prefill on its first blocks, every position's
    logits) is float32 transformers' on model_dir: 1 up to near-ties, near 0 for a model wired wrong."""
    from support.reference import hf_logits

    table = list(range(-(-len(tokens) // block_size)))
    logits = runner.execute(ScheduledBatch([ScheduledRequest("agreement", tokens, 0, table, 0, len(tokens))]))
    reference = hf_logits(model_dir, tokens)
    return float((logits.float().argmax(-1).cpu() == reference.argmax(-1)).float().mean())


def assert_equal_or_near_tie(engine: Engine, prompts_by_id: dict[str, list[int]], got_by_id: dict[str, list[int]],
                             expected_by_id: dict[str, list[int]], block_size: int) -> None:
    """bf16: a different batch shape may flip a near-tie of the target; any other difference fails."""
    for rid, expected in expected_by_id.items():
        got = got_by_id[rid]
        if got != expected:
            first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            gap = top2_gap(engine.runner, prompts_by_id[rid] + expected[:first], block_size)
            print(f"{rid}: first difference at token {first}, top-2 logit gap {gap:.4f}")
            assert gap < 0.1, f"{rid} differs at token {first} with a top-2 gap of {gap:.3f}: not a near-tie"


def host_syncs_per_step(engine: Engine) -> list[int]:
    """Steps `engine` to the end under torch's CUDA sync debug mode: the host syncs each step made."""
    counts = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while engine.has_unfinished_requests():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine.step()
            counts.append(sum("synchroniz" in str(w.message) for w in caught))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return counts
