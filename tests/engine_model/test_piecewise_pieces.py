"""The pieces of engine/piecewise_graphs.py, run in order as their graphs replay (on the CPU, in float32, without a
capture): the forward they make, padding rows and all, gives the model's own forward's logits and KV cache (padding
rows write only to the scratch block) for prompt, mixed and decode steps; the buckets stop at the step budget or 2,048 tokens. tests/gpu/test_piecewise_graphs.py replays them
from CUDA graphs."""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.engine.piecewise_graphs import PiecewiseGraphs, token_buckets

BLOCK = 16


def with_eager_pieces(runner: ModelRunner, max_tokens: int) -> PiecewiseGraphs:
    """runner's pieces, each bucket's "graphs" calling the pieces themselves: what a capture records, run live. As
    capture_cuda_graphs does, it takes the last KV block as the scratch block that padding rows write to."""
    runner.num_blocks -= 1
    pieces = PiecewiseGraphs(runner.model, max_tokens, runner.num_blocks * BLOCK, runner.device)
    for rows in pieces.buckets:
        pieces._graphs[rows] = [SimpleNamespace(replay=partial(piece, rows)) for piece in pieces._pieces()]
    runner.pieces = pieces
    return pieces


def steps() -> list[ScheduledBatch]:
    """Two prompts (23 tokens: the 32 bucket), then a mixed step (a verify step, a decode step and a new prompt's
    first chunk: 17 tokens), then the prompts' last tokens again (2 tokens: below the smallest bucket)."""
    return [
        ScheduledBatch([ScheduledRequest("a", list(range(3, 16)), 0, [0], 0, 1),
                        ScheduledRequest("b", list(range(40, 50)), 0, [1], 0, 1)]),
        ScheduledBatch([ScheduledRequest("a", [5, 6, 7, 8], 13, [0, 2], 3, 4),
                        ScheduledRequest("b", [9], 10, [1], 0, 1),
                        ScheduledRequest("c", list(range(60, 72)), 0, [3], 0, 0)]),
        ScheduledBatch([ScheduledRequest("a", [15], 12, [0], 0, 1), ScheduledRequest("b", [49], 9, [1], 0, 1)]),
    ]


def test_the_pieces_in_order_give_the_models_forward(tiny_llama):
    plain = ModelRunner(tiny_llama, dtype="float32", block_size=BLOCK, kv_cache_bytes=1 << 20)
    piecewise = ModelRunner(tiny_llama, dtype="float32", block_size=BLOCK, kv_cache_bytes=1 << 20)
    with_eager_pieces(piecewise, 64)
    for expected_batch, batch in zip(steps(), steps()):
        expected = plain.execute(expected_batch)
        got = piecewise.execute(batch)
        assert (plain.last_forward_path, piecewise.last_forward_path) == ("eager", "piecewise")
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    owned = piecewise.num_blocks  # every block but the scratch block: padding rows wrote nowhere else
    for caches_plain, caches_pieces in ((plain.kv_cache.k_caches, piecewise.kv_cache.k_caches),
                                        (plain.kv_cache.v_caches, piecewise.kv_cache.v_caches)):
        for cache_plain, cache_pieces in zip(caches_plain, caches_pieces):
            torch.testing.assert_close(cache_pieces[:owned], cache_plain[:owned], atol=1e-5, rtol=1e-5)


def test_a_step_above_the_largest_bucket_runs_the_models_forward(tiny_llama):
    runner = ModelRunner(tiny_llama, dtype="float32", block_size=BLOCK, kv_cache_bytes=1 << 20)
    with_eager_pieces(runner, 16)
    runner.execute(ScheduledBatch([ScheduledRequest("a", list(range(3, 20)), 0, [0, 1], 0, 1)]))  # 17 tokens
    assert runner.last_forward_path == "eager"
    runner.execute(ScheduledBatch([ScheduledRequest("b", list(range(3, 19)), 0, [2], 0, 1)]))  # 16 tokens
    assert runner.last_forward_path == "piecewise"


def test_buckets_stop_at_the_step_budget_or_2048():
    assert token_buckets(1) == [16]
    assert token_buckets(100) == [16, 32, 64, 96, 128]
    assert token_buckets(8192)[-1] == token_buckets(2048)[-1] == 2048
