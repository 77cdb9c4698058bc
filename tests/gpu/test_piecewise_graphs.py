"""The model's captured pieces on CUDA (engine/piecewise_graphs.py): prompt chunks and mixed steps replayed from them
give the eager forward's logits and KV, a step beyond the largest bucket runs eagerly, and an engine gives the same
greedy text with them as without."""
from __future__ import annotations

import pytest
import torch

from support.engine_runs import assert_equal_or_near_tie, generate_greedy
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest

pytestmark = pytest.mark.gpu
BLOCK = 256


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Qwen3-style model (QK-norm, GQA, head_dim 64) with three layers."""
    pytest.importorskip("flash_attn")
    from engine_model.checkpoints import save_tiny_checkpoint

    folder = tmp_path_factory.mktemp("gpu-qwen3")
    save_tiny_checkpoint("qwen3-qk_norm-untied", folder, head_dim=64, max_position_embeddings=2048, num_hidden_layers=3,
                         vocab_size=512)
    return folder


def make_runner(checkpoint, max_piecewise_tokens: int):
    from verifier_service.engine.model_runner import ModelRunner

    runner = ModelRunner(checkpoint, device="cuda", dtype="bfloat16", block_size=BLOCK, kv_cache_bytes=64 << 20)
    assert runner.capture_cuda_graphs(8, [1, 5], max_piecewise_tokens=max_piecewise_tokens)
    assert (runner.pieces is not None) is (max_piecewise_tokens > 0)
    return runner


PROMPTS = [list(range(3, 40)), [7, 8, 9] * 90, list(range(100, 400))]
TABLES = [[0, 1], [5, 2], [4, 6]]


def steps() -> list[ScheduledBatch]:
    """Three prompts in one step (607 tokens), then a mixed step: r0 verifies 4 drafts, r1 decodes, r3 sends a
    first chunk of 40 prompt tokens (no logits), r2 its prompt's last 7 tokens again from position 293."""
    return [
        ScheduledBatch([ScheduledRequest(f"r{i}", p, 0, t, 0, 1) for i, (p, t) in enumerate(zip(PROMPTS, TABLES))]),
        ScheduledBatch([ScheduledRequest("r0", [11, 12, 13, 14, 15], 37, TABLES[0], 4, 5),
                        ScheduledRequest("r1", [21], 270, TABLES[1], 0, 1),
                        ScheduledRequest("r3", list(range(200, 240)), 0, [7], 0, 0),
                        ScheduledRequest("r2", PROMPTS[2][-7:], 293, TABLES[2], 0, 1)]),
    ]


def test_steps_from_the_pieces_equal_eager_steps_in_logits_and_kv(checkpoint):
    """Every step above runs through the pieces when they are captured, eagerly when not, to the same logits and KV."""
    eager, pieces = make_runner(checkpoint, 0), make_runner(checkpoint, 1024)
    assert pieces.pieces.buckets == [16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    for batch_eager, batch_pieces in zip(steps(), steps()):
        expected = eager.execute(batch_eager).float()
        got = pieces.execute(batch_pieces).float()
        assert (eager.last_forward_path, pieces.last_forward_path) == ("eager", "piecewise")
        assert got.shape == expected.shape == (batch_eager.num_logits, eager.vocab_size)
        torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)
    scratch = pieces.num_blocks  # the decode graphs' scratch block: the only one either runner may differ in
    for name in ("k_caches", "v_caches"):
        for cache_eager, cache_pieces in zip(getattr(eager.kv_cache, name), getattr(pieces.kv_cache, name)):
            torch.testing.assert_close(cache_pieces[:scratch].float(), cache_eager[:scratch].float(), atol=3e-2,
                                       rtol=0)


def test_a_step_beyond_the_largest_bucket_runs_eagerly(checkpoint):
    runner = make_runner(checkpoint, 64)
    assert runner.pieces.buckets == [16, 32, 64]
    runner.execute(ScheduledBatch([ScheduledRequest("r0", PROMPTS[0], 0, TABLES[0], 0, 1)]))  # 37 tokens
    assert runner.last_forward_path == "piecewise"
    runner.execute(ScheduledBatch([ScheduledRequest("r2", PROMPTS[2], 0, TABLES[2], 0, 1)]))  # 300 tokens
    assert runner.last_forward_path == "eager"


def test_an_engine_with_the_pieces_gives_the_greedy_text_of_eager_prompt_steps(checkpoint, monkeypatch):
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine

    def engine(pieces: bool) -> Engine:
        monkeypatch.setenv("SPECD_PIECEWISE_GRAPHS", "1" if pieces else "0")
        return Engine(EngineConfig(model=str(checkpoint), device="cuda", dtype="bfloat16", block_size=BLOCK,
                                   kv_cache_bytes=64 << 20, max_num_seqs=8, num_speculative_tokens=0,
                                   max_num_batched_tokens=256, enable_prefix_caching=False))

    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[1][:100]]  # 300 tokens: chunks of at most 256
    plain = generate_greedy(engine(False), prompts, 24)
    graphed = engine(True)
    outputs = generate_greedy(graphed, prompts, 24)
    stats = graphed.take_step_stats()
    assert sum(s.num_piecewise_replays for s in stats) >= 2  # the prompt chunks (and any mixed step)
    assert_equal_or_near_tie(graphed, {f"r{i}": p for i, p in enumerate(prompts)}, outputs, plain, BLOCK)


def test_prompt_chunks_beside_drafting_sequences_launched_ahead_give_the_plain_greedy_text(checkpoint, monkeypatch):
    """Prompts in 64-token chunks while a short one already drafts: mixed steps (the pieces) launched ahead of a step
    whose drafts they continue from, their positions, slots and context lengths moved on the device."""
    from support.proposers import OracleProposer
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine import model_runner
    from verifier_service.engine.engine import Engine

    advanced = []  # the steps whose starts moved on the device
    advance = model_runner.advance_on_device
    monkeypatch.setattr(model_runner, "advance_on_device", lambda *args: advanced.append(1) or advance(*args))

    def engine(proposer, async_scheduling: bool) -> Engine:
        return Engine(EngineConfig(model=str(checkpoint), device="cuda", dtype="bfloat16", block_size=BLOCK,
                                   kv_cache_bytes=64 << 20, max_num_seqs=8, num_speculative_tokens=4,
                                   max_num_batched_tokens=64, enable_prefix_caching=False,
                                   async_scheduling=async_scheduling), proposer)

    prompts = [PROMPTS[0][:20], PROMPTS[1], PROMPTS[2]]
    plain = generate_greedy(engine(None, async_scheduling=False), prompts, 24)
    proposer = OracleProposer({rid: prompts[int(rid[1:])] + out for rid, out in plain.items()})
    ahead = engine(proposer, async_scheduling=True)
    outputs = generate_greedy(ahead, prompts, 24)
    assert ahead.runner.pieces is not None and advanced and proposer.num_proposed > 0
    assert_equal_or_near_tie(ahead, {f"r{i}": p for i, p in enumerate(prompts)}, outputs, plain, BLOCK)
