"""torch.compile'd decoder regions on CUDA equal the eager layers within bf16 tolerance, for a Llama and a
Qwen3 (QK-norm) layout, on prefill, decode and verify steps; graphs capture the compiled code."""
from __future__ import annotations

import pytest
import torch

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest

pytestmark = pytest.mark.gpu
BLOCK = 256


@pytest.fixture(scope="module", params=["llama-gqa-llama3-rope-untied-sharded", "qwen3-qk_norm-untied"])
def checkpoint(request, tmp_path_factory):
    pytest.importorskip("flash_attn")
    from engine_model.checkpoints import save_tiny_checkpoint

    folder = tmp_path_factory.mktemp(request.param)
    save_tiny_checkpoint(request.param, folder, head_dim=64, max_position_embeddings=2048, num_hidden_layers=3,
                         vocab_size=512)
    return folder


def steps():
    prompts, tables = [list(range(3, 60)), [9, 8, 7] * 70], [[0, 1], [3, 2]]
    yield ScheduledBatch([ScheduledRequest(f"r{i}", p, 0, t, 0, 1) for i, (p, t) in enumerate(zip(prompts, tables))])
    yield ScheduledBatch([ScheduledRequest(f"r{i}", [11], len(p), t, 0, 1) for i, (p, t) in enumerate(zip(prompts, tables))])
    yield ScheduledBatch([ScheduledRequest(f"r{i}", [12, 13, 14, 15, 16], len(p) + 1, t, 4, 5)
                          for i, (p, t) in enumerate(zip(prompts, tables))])


@pytest.mark.parametrize("graphs", [False, True])
def test_compiled_regions_equal_eager_layers(checkpoint, graphs):
    from verifier_service.engine.model_runner import ModelRunner

    results = []
    for compile_model in (False, True):
        runner = ModelRunner(checkpoint, device="cuda", dtype="bfloat16", block_size=BLOCK, kv_cache_bytes=64 << 20,
                             compile_model=compile_model)
        assert runner.compiled == compile_model
        if graphs:
            assert runner.capture_cuda_graphs(4, [1, 5])
        results.append([runner.execute(batch) for batch in steps()])
    for eager, compiled in zip(*results):
        compiled, eager = compiled.float(), eager.float()  # logits come in the model's dtype (bf16)
        relative = (compiled - eager).norm() / eager.norm()
        assert torch.isfinite(compiled).all() and relative < 2e-2, f"relative error {relative:.2e}"
