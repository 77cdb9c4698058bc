"""CPU linear layers through oneDNN with prepacked weights (verifier_service/model/cpu_linear.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine_model.checkpoints import prefill_request
from specd import environment
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.model.cpu_linear import (CHUNK_ROWS, PrepackedLinear, onednn_linear_enabled,
                                              padded_rows)

pytestmark = pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.float32),
                                reason="this torch build has no oneDNN")


@pytest.mark.parametrize("num_rows", [1, 9, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_linear_equals_f_linear(num_rows, bias):
    torch.manual_seed(0)
    linear = nn.Linear(576, 960, bias=bias)
    packed = PrepackedLinear(linear)
    wide = torch.randn(num_rows, 2 * 576)
    for x in (wide[:, :576].contiguous(), wide[:, 576:]):  # contiguous and strided rows (as after a split)
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_linear_in_bfloat16_is_close(bias):
    """In bfloat16 where the CPU has oneDNN's bfloat16 instructions; elsewhere packed in float32 (upcast in,
    bfloat16 out): what the deterministic mode runs on such CPUs."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 512, bias=bias).to(torch.bfloat16)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        y = PrepackedLinear(linear)(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), linear(x).float(), atol=2e-2, rtol=2e-2)


def logits_and_linears(checkpoint) -> tuple[torch.Tensor, set[type]]:
    runner = ModelRunner(checkpoint, dtype="float32", block_size=4, kv_cache_bytes=1 << 20)
    prompt = list(range(3, 40))
    logits = runner.execute(ScheduledBatch([prefill_request("r", prompt, list(range(10)))]))
    kinds = {type(m) for m in runner.model.modules() if isinstance(m, (nn.Linear, PrepackedLinear))}
    return logits, kinds


def test_cpu_runner_prepacks_every_linear_and_the_switch_turns_it_off(tiny_llama, monkeypatch):
    packed_logits, packed_kinds = logits_and_linears(tiny_llama)
    monkeypatch.setenv(environment.ONEDNN_LINEAR, "0")
    dense_logits, dense_kinds = logits_and_linears(tiny_llama)
    assert packed_kinds == {PrepackedLinear} and dense_kinds == {nn.Linear}
    torch.testing.assert_close(packed_logits, dense_logits, atol=1e-5, rtol=1e-5)


def test_row_counts_are_padded_to_a_few_shapes():
    """oneDNN keeps a compiled primitive per input shape: at most 24 shapes per weight, ever."""
    padded = {rows: padded_rows(rows) for rows in range(1, CHUNK_ROWS + 1)}
    assert all(rows <= size <= 1.5 * rows for rows, size in padded.items())
    assert all(padded[rows] == rows for rows in range(1, 17))  # decode / verify of small batches: exact
    assert len(set(padded.values())) == 24 and max(padded.values()) == CHUNK_ROWS


@pytest.mark.parametrize("num_rows", [17, 200, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 5])
def test_padded_and_chunked_inputs_equal_f_linear(num_rows):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True)
    x = torch.randn(num_rows, 64)
    with torch.inference_mode():
        torch.testing.assert_close(PrepackedLinear(linear)(x), linear(x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.bfloat16),
                    reason="oneDNN takes no bfloat16 weights here: every bfloat16 linear is packed in float32")
@pytest.mark.parametrize("dot_products", [False, True])
def test_fixed_row_bfloat16_linears_are_packed_in_float32_where_the_cpu_would_emulate_bfloat16(monkeypatch,
                                                                                              dot_products):
    """A fixed-row linear (the deterministic mode's) is a 16-row GEMM at every step: its cost is compute, which oneDNN
    emulates for bfloat16 on a CPU without bfloat16 dot products. Serving's linears keep bfloat16 weights."""
    from verifier_service.model import cpu_linear

    monkeypatch.setattr(cpu_linear, "_bfloat16_dot_products", lambda: dot_products)
    linear = nn.Linear(256, 512).to(torch.bfloat16)
    fixed, serving = PrepackedLinear(linear, fixed_rows=16), PrepackedLinear(linear)
    assert fixed.packed_weight.dtype == (torch.bfloat16 if dot_products else torch.float32)
    assert serving.packed_weight.dtype == torch.bfloat16
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert fixed(x).dtype == torch.bfloat16
        torch.testing.assert_close(fixed(x).float(), serving(x).float(), atol=2e-2, rtol=2e-2)
