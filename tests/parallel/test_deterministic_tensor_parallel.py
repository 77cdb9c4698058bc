"""The deterministic mode on two CPU ranks (gloo) with the real default model in bfloat16: greedy text identical,
with no tolerance, alone without drafts and batched with drafts (k = 4 and 8). The ranks' partial sums are added in
rank order (sharding/collectives.py: use_fixed_order) and the row-parallel layers run fixed-row oneDNN linears
(sharding/layers.py: use_fixed_rows)."""
from functools import partial

import pytest
import torch

from specd.sampling import SamplingParams
from support.engine_runs import generate_each
from verifier_service.engine.config import EngineConfig
from verifier_service.model.cpu_linear import onednn_linear_enabled
from verifier_service.runners import build_model_runner
from verifier_service.sharding import collectives
from verifier_service.sharding.layers import RowParallelLinear, use_fixed_rows

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.bfloat16, upcast=True),
                                 reason="no oneDNN linears here (the mode refuses to start)")]

NUM_PROMPTS, MAX_TOKENS = 3, 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
CONFIG = EngineConfig(model="default", device="cpu", dtype="bfloat16", kv_cache_bytes=64 * 2**20,
                      num_speculative_tokens=0, async_scheduling=False, deterministic=True, tensor_parallel_size=2)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from bench.deterministic import tokenize

    return tokenize("default", NUM_PROMPTS)


@pytest.fixture(scope="module")
def runner():
    """Rank 0's runner; rank 1 runs in its own process until the module is done."""
    runner = build_model_runner(CONFIG)
    yield runner
    runner.close()


generate = partial(generate_each, CONFIG)  # (runner, prompts, params, k, together, engine)


def test_a_row_parallel_layer_gives_a_row_the_same_bits_alone_and_batched():
    """Plain F.linear does not in float32 here (a 1-row and a 5-row product sum in other orders)."""
    torch.manual_seed(0)
    layer = RowParallelLinear(1536, 576, bias=False, reduce_output=False)
    use_fixed_rows(layer, 16)
    x = torch.randn(5, 1536, dtype=layer.weight.dtype)
    with torch.inference_mode():
        alone, batched = layer(x[:1]), layer(x)[:1]
    assert torch.equal(alone, batched)
    assert torch.allclose(alone, x[:1] @ layer.weight.t(), atol=1e-4, rtol=1e-4)


def test_the_ranks_sum_in_rank_order(runner):
    assert runner.tensor_parallel_size == 2 and collectives._fixed_order
    assert collectives.all_reduce_in_use() == "nccl"  # no one-shot all-reduce in the mode (gloo on the CPU)


def test_greedy_text_is_the_same_alone_and_batched_with_drafts(runner, prompts):
    alone = generate(runner, prompts, GREEDY, together=False)
    assert generate(runner, prompts, GREEDY, 4) == alone
    assert generate(runner, prompts, GREEDY, 8) == alone
