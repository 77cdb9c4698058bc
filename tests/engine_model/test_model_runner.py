"""ModelRunner: chunked prefill, verify steps and mixed batches give the logits of one plain prefill."""
from __future__ import annotations

import pytest
import torch

from engine_model.checkpoints import prefill_request, random_block_tables
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner

BLOCK_SIZE = 4
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def runner(tiny_llama):
    return ModelRunner(tiny_llama, dtype="float32", block_size=BLOCK_SIZE, kv_cache_bytes=1 << 20)


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(5)).tolist()


def chunk(request_id, token_ids, start, table, num_logits, num_draft_tokens=0):
    return ScheduledRequest(request_id, token_ids, start, table, num_draft_tokens, num_logits)


def full_prefill(runner, prompt, seed=0):
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], BLOCK_SIZE, seed)
    return runner.execute(ScheduledBatch([prefill_request("full", prompt, table)]))


def test_prefill_in_chunks_equals_one_prefill(runner, prompt):
    expected = full_prefill(runner, prompt)
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], BLOCK_SIZE, seed=7)
    rows = []
    for start, end in [(0, 7), (7, 8), (8, 21), (21, 30)]:  # chunk edges off the block boundaries
        rows.append(runner.execute(ScheduledBatch([chunk("r", prompt[start:end], start, table, end - start)])))
    torch.testing.assert_close(torch.cat(rows), expected, **TOLERANCE)


def test_chunks_before_the_prompt_end_return_no_logits(runner, prompt):
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], BLOCK_SIZE, seed=8)
    first = runner.execute(ScheduledBatch([chunk("r", prompt[:20], 0, table, 0)]))
    last = runner.execute(ScheduledBatch([chunk("r", prompt[20:], 20, table, 1)]))
    assert first.shape == (0, runner.vocab_size)
    torch.testing.assert_close(last, full_prefill(runner, prompt)[-1:], **TOLERANCE)


def test_verify_step_scores_every_draft_position(runner, prompt):
    """[last token] + 3 drafts after a cached prefix: logits of the last 4 positions of a full prefill."""
    [table] = random_block_tables(runner.num_blocks, [len(prompt)], BLOCK_SIZE, seed=9)
    runner.execute(ScheduledBatch([chunk("r", prompt[:26], 0, table, 1)]))
    verify = runner.execute(ScheduledBatch([chunk("r", prompt[26:], 26, table, 4, num_draft_tokens=3)]))
    torch.testing.assert_close(verify, full_prefill(runner, prompt)[-4:], **TOLERANCE)


def test_mixed_batch_rows_come_in_request_order(runner, prompt):
    """A prefill chunk, a decode and a verify in one step equal each run on its own."""
    other = prompt[::-1]
    table_a, table_b, table_c = random_block_tables(runner.num_blocks, [12, 30, 30], BLOCK_SIZE, seed=10)
    runner.execute(ScheduledBatch([chunk("b", prompt[:29], 0, table_b, 0), chunk("c", other[:25], 0, table_c, 0)]))
    logits = runner.execute(ScheduledBatch([
        chunk("a", prompt[:12], 0, table_a, 2),  # a whole short prompt; 2 rows asked
        chunk("b", prompt[29:], 29, table_b, 1),  # decode
        chunk("c", other[25:], 25, table_c, 5, num_draft_tokens=4),  # verify 4 drafts
    ]))
    expected = torch.cat([full_prefill(runner, prompt[:12])[-2:], full_prefill(runner, prompt)[-1:],
                          full_prefill(runner, other)[-5:]])
    torch.testing.assert_close(logits, expected, **TOLERANCE)


def test_block_table_too_short_is_rejected_by_name(runner, prompt):
    with pytest.raises(ValueError, match="block_table"):
        runner.execute(ScheduledBatch([chunk("r", prompt[:9], 0, [0, 1], 1)]))


def test_positions_beyond_max_model_len_are_rejected(tiny_llama):
    short = ModelRunner(tiny_llama, dtype="float32", block_size=BLOCK_SIZE, kv_cache_bytes=1 << 20, max_model_len=8)
    assert short.max_model_len == 8
    with pytest.raises(ValueError, match="max_model_len"):
        short.execute(ScheduledBatch([chunk("r", list(range(9)), 0, [0, 1, 2], 1)]))


def test_warm_up_runs_and_leaves_the_runner_usable(runner, prompt):
    runner.warm_up()
    torch.testing.assert_close(full_prefill(runner, prompt, seed=11), full_prefill(runner, prompt), **TOLERANCE)


def test_token_ids_outside_the_vocabulary_are_rejected(runner):
    with pytest.raises(ValueError, match="token_ids"):
        runner.execute(ScheduledBatch([chunk("r", [1, runner.vocab_size], 0, [0], 1)]))
