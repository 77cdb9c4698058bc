"""The deterministic mode's kernels on the CPU: a token's logits are bit for bit the same whatever else the step
holds (a decode, a verify of k drafts, other sequences, another paging of its KV), and a fixed-row linear's row
does not depend on the rows beside it. (The tiny model shows the default kernels differing in float32; in
bfloat16 its few dimensions round the difference away, which the default model's do not.)"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine_model.checkpoints import random_block_tables
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.model.cpu_linear import PrepackedLinear, onednn_linear_enabled

BLOCK_SIZE = 4
pytestmark = pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.bfloat16, upcast=True),
                                reason="no oneDNN linears here (the mode refuses to start)")


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def runner(tiny_llama, request):
    return ModelRunner(tiny_llama, dtype=request.param, block_size=BLOCK_SIZE, kv_cache_bytes=1 << 20,
                       deterministic=True)


def chunk(request_id, token_ids, start, table, num_logits, num_draft_tokens=0):
    return ScheduledRequest(request_id, token_ids, start, table, num_draft_tokens, num_logits)


def test_decode_verify_and_a_mixed_batch_give_the_same_bits(runner):
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    other = prompt[::-1]
    table, second_table, other_table = random_block_tables(runner.num_blocks, [40, 40, 40], BLOCK_SIZE, seed=4)
    runner.execute(ScheduledBatch([chunk("r", prompt[:35], 0, table, 1)]))
    decoded = torch.cat([runner.execute(ScheduledBatch([chunk("r", prompt[p:p + 1], p, table, 1)]))
                         for p in range(35, 40)])
    verified = runner.execute(ScheduledBatch([chunk("r", prompt[35:], 35, table, 5, num_draft_tokens=4)]))
    # The same tokens again, prefilled in other chunks into other pages, beside another sequence's prefill.
    runner.execute(ScheduledBatch([chunk("s", prompt[:17], 0, second_table, 0)]))
    mixed = runner.execute(ScheduledBatch([chunk("o", other, 0, other_table, 3),
                                           chunk("s", prompt[17:], 17, second_table, 5)]))
    assert torch.equal(verified, decoded)
    assert torch.equal(mixed[3:], decoded)


def test_a_fixed_row_linear_computes_each_row_alone():
    torch.manual_seed(0)
    linear = PrepackedLinear(nn.Linear(1536, 64, bias=False).to(torch.bfloat16), fixed_rows=16)
    with torch.inference_mode():
        for _ in range(20):
            x = torch.randn(37, 1536, dtype=torch.bfloat16) * 3
            rows = torch.cat([linear(x[i:i + 1]) for i in range(37)])
            assert torch.equal(linear(x), rows) and torch.equal(linear(x[:5]), rows[:5])
