"""flash-attn paged attention (CUDA) equals dense causal attention, and the runner picks it when it can."""
from __future__ import annotations

import pytest
import torch

from engine_model.paged_step import paged_step, run_backend
from verifier_service.attention.backend import select_backend

pytestmark = pytest.mark.gpu
BLOCK = 256  # flash-attn 2 paged KV needs a multiple of 256

LAYOUTS = [
    ([300], [1]),  # batch-1 decode: the Triton GQA-packed kernel (too few sequences to fill the GPU)
    ([100, 700, 3], [5, 5, 5]),  # everyone verifying 4 drafts: the Triton kernel
    ([0, 9, 600, 255], [300, 1, 5, 2]),  # prefill chunk mixed with decode and verify: the varlen kernel
]


@pytest.mark.parametrize("cached_lens, query_lens", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_paged_attention_equals_dense_causal_attention(cached_lens, query_lens, dtype):
    pytest.importorskip("flash_attn")
    from verifier_service.attention.flash import FlashAttentionBackend

    step = paged_step(cached_lens, query_lens, BLOCK, seed=0, head_dim=64, device="cuda", dtype=dtype)
    torch.testing.assert_close(run_backend(FlashAttentionBackend(), step), step.dense, atol=2e-2, rtol=2e-2)


def test_reference_backend_runs_on_cuda_too():
    from verifier_service.attention.reference import ReferenceAttentionBackend

    step = paged_step([0, 9, 30], [11, 1, 4], 16, seed=1, device="cuda")
    torch.testing.assert_close(run_backend(ReferenceAttentionBackend(), step), step.dense, atol=1e-4, rtol=1e-4)


def test_select_backend_prefers_flash_only_where_it_applies():
    assert select_backend("cpu", BLOCK, torch.bfloat16).name == "reference"
    assert select_backend("cuda", 16, torch.bfloat16).name == "reference"  # block too small for flash-attn
    assert select_backend("cuda", BLOCK, torch.float32).name == "reference"  # flash-attn is half precision only
    pytest.importorskip("flash_attn")
    assert select_backend("cuda", BLOCK, torch.bfloat16).name == "flash-attn"


@pytest.fixture(scope="module")
def llama_head_dim_64(tmp_path_factory):
    """flash-attn builds may carry only the common head sizes (64, 128)."""
    from engine_model.checkpoints import save_tiny_checkpoint

    folder = tmp_path_factory.mktemp("llama-head-dim-64")
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder, head_dim=64, max_position_embeddings=512)
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_runner_on_cuda_matches_the_cpu_runner(llama_head_dim_64, dtype):
    """The same mixed step (prefill chunk + verify) on CUDA, with flash-attn where it applies."""
    from engine_model.checkpoints import random_block_tables
    from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
    from verifier_service.engine.model_runner import ModelRunner

    cpu = ModelRunner(llama_head_dim_64, device="cpu", dtype="float32", block_size=BLOCK, kv_cache_bytes=64 << 20)
    cuda = ModelRunner(llama_head_dim_64, device="cuda", dtype=dtype, block_size=BLOCK, kv_cache_bytes=64 << 20)
    prompts = [[i % 128 for i in range(1, 300)], list(range(5, 60))]
    logits = {}
    for name, runner in (("cpu", cpu), ("cuda", cuda)):
        table_a, table_b = random_block_tables(8, [300, 60], BLOCK, seed=0)
        runner.execute(ScheduledBatch([ScheduledRequest("b", prompts[1][:50], 0, table_b, 0, 0)]))
        logits[name] = runner.execute(ScheduledBatch([
            ScheduledRequest("a", prompts[0], 0, table_a, 0, 3),
            ScheduledRequest("b", prompts[1][50:], 50, table_b, 4, 5),
        ])).float().cpu()  # the model's dtype: bf16 on CUDA
    assert cuda.backend.name == ("flash-attn" if dtype == "bfloat16" else "reference")
    tolerance = 1e-3 if dtype == "float32" else 5e-2
    torch.testing.assert_close(logits["cuda"], logits["cpu"], atol=tolerance, rtol=tolerance)


def test_gpu_memory_fraction_sizes_the_cache(tiny_llama):
    from verifier_service.engine.model_runner import ModelRunner

    free, total = torch.cuda.mem_get_info()
    fraction = min(1.0, (total - free) / total + 0.02)  # about 2% of the card beyond what is in use
    runner = ModelRunner(tiny_llama, device="cuda", dtype="bfloat16", block_size=BLOCK, gpu_memory_utilization=fraction)
    block_bytes = 2 * 2 * BLOCK * 2 * 16 * 2  # 2 layers, 2 KV heads of 16, bf16
    assert runner.num_blocks * block_bytes == pytest.approx(0.02 * total, rel=0.1)
