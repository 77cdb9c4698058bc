"""Two CPU ranks over gloo give the logits of one process (float32), for every model family."""
from __future__ import annotations

import pytest
import torch

from engine_model.checkpoints import TINY_CHECKPOINTS, prefill_request, random_block_tables, save_tiny_checkpoint
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.config import EngineConfig
from verifier_service.runners import build_model_runner

BLOCK_SIZE = 4
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=sorted(TINY_CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tiny_checkpoint(request.param, folder)
    return folder


def runner_for(checkpoint, tensor_parallel_size: int):
    config = EngineConfig(model=str(checkpoint), device="cpu", dtype="float32", block_size=BLOCK_SIZE,
                          kv_cache_bytes=1 << 20, tensor_parallel_size=tensor_parallel_size)
    return build_model_runner(config)


def steps(num_blocks: int):
    """A prefill of three prompts (shuffled blocks), then a verify step with drafts and a plain decode step."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=generator).tolist() for n in (23, 7, 40)]
    tables = random_block_tables(num_blocks, [len(p) + 8 for p in prompts], BLOCK_SIZE, seed=2)
    yield ScheduledBatch([prefill_request(f"r{i}", p, t) for i, (p, t) in enumerate(zip(prompts, tables))])
    yield ScheduledBatch([ScheduledRequest(f"r{i}", [5, 6, 7, 8][:1 + i], len(p), t, i, 1 + i)
                          for i, (p, t) in enumerate(zip(prompts, tables))])
    yield ScheduledBatch([ScheduledRequest(f"r{i}", [9], len(p) + 1 + i, t, 0, 1)
                          for i, (p, t) in enumerate(zip(prompts, tables))])


def test_two_ranks_give_the_logits_of_one(checkpoint):
    single = runner_for(checkpoint, 1)
    expected = [single.execute(batch) for batch in steps(single.num_blocks)]
    sharded = runner_for(checkpoint, 2)
    try:
        attention = sharded.model.model.layers[0].self_attn  # rank 0's half of the heads (KV heads replicated
        assert attention.num_heads == single.config.num_heads // 2  # where the model has fewer than two)
        assert attention.num_kv_heads == max(1, single.config.num_kv_heads // 2)
        got = [sharded.execute(batch) for batch in steps(sharded.num_blocks)]
    finally:
        sharded.close()
    for step_got, step_expected in zip(got, expected):
        assert step_got.shape == step_expected.shape
        torch.testing.assert_close(step_got, step_expected, **TOLERANCE)


def test_rank_0_alone_offers_no_method_the_other_ranks_would_miss(tmp_path):
    """A local-runner method run on rank 0 only would leave the other ranks waiting in a collective."""
    save_tiny_checkpoint("mistral-gqa", tmp_path)
    sharded = runner_for(tmp_path, 2)
    try:
        assert sharded.num_blocks > 0 and sharded.graphs is None  # attributes are rank 0's runner's
        assert getattr(sharded, "warm_up", None) is None and getattr(sharded, "capture_cuda_graphs", None) is None
        assert sharded.execute_greedy(next(steps(sharded.num_blocks))) is None  # no CUDA graph on the CPU: nothing sent
        assert sharded.execute(next(steps(sharded.num_blocks))).shape[1] == sharded.vocab_size
    finally:
        sharded.close()


def test_random_weights_over_two_ranks_still_lead_each_token_to_the_next(tmp_path):
    """Random weights draw a rank's shard on its GPU (70B shapes have no checkpoint; the retired TP bench,
    bench/gpu_tp.py at commit 2e60c5c, ran them so): the LM head rows of one rank come from embedding rows another
    rank holds, so greedy goes from t to t + 1 across the ranks' vocabulary split."""
    save_tiny_checkpoint("qwen3-qk_norm-untied", tmp_path)  # only its config.json is read
    config = EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", block_size=BLOCK_SIZE,
                          kv_cache_bytes=1 << 20, tensor_parallel_size=2, random_weights=True)
    sharded = build_model_runner(config)
    try:
        vocab = sharded.vocab_size
        for last in (3, vocab // 2 - 1, vocab // 2, vocab - 1):  # either side of the split, and the wrap-around
            logits = sharded.execute(ScheduledBatch([prefill_request("r", [7, 1, 9, last], [0])]))[-1]
            assert int(logits.argmax()) == (last + 1) % vocab
    finally:
        sharded.close()
