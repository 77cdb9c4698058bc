"""The deterministic mode on CUDA (bfloat16): its kernels give a row the same bits in any step, and the default model
gives the same greedy and seeded text, with no tolerance, with speculation off and at k = 2 / 4 / 8, alone and among
63 other requests, after preemption, run after run, with CUDA graphs replayed."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_model.checkpoints import random_block_tables
from specd.sampling import SamplingParams
from support.engine_runs import argmax_agreement, generate_each as generate
from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
pytest.importorskip("triton")
BLOCK, MAX_TOKENS, NUM_PROMPTS = 256, 64, 8


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@torch.inference_mode()  # as the runner calls it (out= GEMMs take no autograd)
@pytest.mark.parametrize("gemms", ["cublas", "triton", "triton-split"])  # SPECD_DETERMINISTIC_GEMMS
def test_linear_rows_do_not_depend_on_the_rows_beside_them(gemms):
    from verifier_service.model.invariant_layers import InvariantLinear

    gen = torch.Generator(device="cuda").manual_seed(0)
    for out_features, in_features in ((960, 576), (576, 1536), (49152, 576), (4096, 12288)):
        module = torch.nn.Linear(in_features, out_features, device="cuda", dtype=torch.bfloat16)
        linear = InvariantLinear(module, gemms)
        x = torch.randn(300, in_features, device="cuda", generator=gen).bfloat16()
        whole = linear(x)
        assert torch.allclose(whole.float(), module(x).float(), atol=0.05, rtol=0.02)
        # read in place with the rows after them as the last GEMM's spare rows, or copied where x ends first
        for rows, first in ((1, 0), (1, 137), (5, 60), (64, 3), (130, 170)):
            assert bits_equal(linear(x[first:first + rows]), whole[first:first + rows]), (rows, first)
        room = torch.full((64, in_features), float("nan"), device="cuda", dtype=torch.bfloat16)
        room[:3] = x[40:43]  # spare rows of NaN, as an empty_rows buffer may hold
        assert bits_equal(linear(room[:3]), whole[40:43])


@torch.inference_mode()
def test_split_parts_handed_on_give_the_bits_the_adding_kernel_gives():
    """o_proj -> the post-attention norm, gate_up_proj -> SiLU-and-multiply, down_proj -> the next norm, each split GEMM
    handing its parts on (kernels/split_sums.py) or adding them in a kernel of its own: the same bits."""
    from verifier_service.kernels.fused_elementwise import silu_and_mul
    from verifier_service.kernels.invariant_norm import rms_norm
    from verifier_service.kernels.split_sums import SplitSums
    from verifier_service.kernels.triton_linear import linear

    gen = torch.Generator(device="cuda").manual_seed(6)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()

    x, residual, norm_weight = randn(37, 576), randn(37, 576), randn(576)
    w_o, b_o, w_gate_up, b_gate_up, w_down = (randn(576, 576, scale=0.05), randn(576), randn(3072, 576, scale=0.05),
                                              randn(3072), randn(576, 1536, scale=0.05))

    def layer(sums_ahead: bool) -> list[torch.Tensor]:
        attended = linear(x, w_o, b_o, split_k=True, sums_ahead=sums_ahead)
        assert isinstance(attended, SplitSums) == sums_ahead
        normed, stream = rms_norm(attended, 1e-5, norm_weight, residual)
        activated = silu_and_mul(linear(normed, w_gate_up, b_gate_up, split_k=True, sums_ahead=sums_ahead))
        out, stream_out = rms_norm(linear(activated, w_down, split_k=True, sums_ahead=sums_ahead), 1e-5,
                                   norm_weight, stream)
        return [normed, stream, activated, out, stream_out]

    for handed_on, added in zip(layer(True), layer(False)):
        assert bits_equal(handed_on, added)


def test_qkv_parts_handed_to_rope_give_the_bits_of_the_adding_kernel_and_rope():
    """qkv_proj -> RoPE (model/invariant_layers.py's project_from_parts): q and k rotated and v from the split GEMM's
    parts in one kernel, or the parts added by a kernel of their own and then rotated: the same bits."""
    from verifier_service.kernels.fused_elementwise import rope
    from verifier_service.kernels.split_sums import SplitSums
    from verifier_service.kernels.triton_linear import linear

    gen = torch.Generator(device="cuda").manual_seed(7)
    heads, kv_heads, head_dim, tokens = 9, 3, 64, 37
    x = torch.randn(tokens, 576, device="cuda", generator=gen).bfloat16()
    w = (torch.randn((heads + 2 * kv_heads) * head_dim, 576, device="cuda", generator=gen) * 0.05).bfloat16()
    bias = torch.randn(w.shape[0], device="cuda", generator=gen).bfloat16()
    cos, sin = (torch.randn(tokens, 1, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(2))
    qkv = linear(x, w, bias, split_k=True)
    q, k = rope(qkv[:, :(heads + kv_heads) * head_dim].view(tokens, -1, head_dim), cos, sin).split([heads, kv_heads], 1)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    parts = linear(x, w, bias, split_k=True, sums_ahead=True)
    assert isinstance(parts, SplitSums)
    fused = rope(parts, cos, sin, heads=heads + 2 * kv_heads, rotated=heads + kv_heads)
    for handed_on, added in zip(fused.split([heads, kv_heads, kv_heads], 1), (q, k, v)):
        assert bits_equal(handed_on, added)


def test_rms_norm_rows_do_not_depend_on_the_rows_beside_them():
    from verifier_service.kernels.invariant_norm import rms_norm

    gen = torch.Generator(device="cuda").manual_seed(1)
    x, residual = (torch.randn(200, 576, device="cuda", generator=gen).bfloat16() for _ in range(2))
    weight = torch.randn(576, device="cuda", generator=gen).bfloat16()
    normed, summed = rms_norm(x, 1e-5, weight, residual)
    h = (residual + x).float()
    assert bits_equal(summed, residual + x)
    assert torch.allclose(normed.float(), weight.float() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5),
                          atol=0.05, rtol=0.02)
    heads = torch.randn(200, 12, 128, device="cuda", generator=gen).bfloat16()
    per_head = rms_norm(heads, 1e-6)[0]
    for rows, first in ((1, 0), (1, 99), (5, 7), (64, 100)):
        assert bits_equal(rms_norm(x[first:first + rows], 1e-5, weight, residual[first:first + rows])[0],
                          normed[first:first + rows])
        assert bits_equal(rms_norm(heads[first:first + rows], 1e-6)[0], per_head[first:first + rows])


def test_fused_rope_and_silu_and_mul_compute_what_the_eager_ops_do():
    from verifier_service.kernels.fused_elementwise import rope, silu_and_mul
    from verifier_service.model.layers import MLP
    from verifier_service.model.rope import RotaryEmbedding

    gen = torch.Generator(device="cuda").manual_seed(4)
    qkv = torch.randn(37, 15 * 64, device="cuda", generator=gen).bfloat16()
    qk = qkv[:, :12 * 64].view(37, 12, 64)  # a column slice, as Attention.project rotates it
    table = RotaryEmbedding({"rope_type": "default", "rope_theta": 10000.0}, 64, 4096).to("cuda")
    table.rebuild(torch.device("cuda"))
    cos, sin = table.lookup(torch.randint(0, 4096, (37,), device="cuda", generator=gen), torch.bfloat16)
    assert torch.allclose(rope(qk, cos, sin).float(), RotaryEmbedding.apply(qk, cos, sin).float(), atol=0.03)
    gate_up = torch.randn(37, 2 * 1536, device="cuda", generator=gen).bfloat16()
    assert torch.allclose(silu_and_mul(gate_up).float(), MLP.activate(gate_up).float(), atol=0.03, rtol=0.01)


def test_attention_gives_a_token_the_same_bits_at_decode_verify_and_prefill():
    """Sequence 0's token at position 700 alone (decode), as the 3rd of 5 verify tokens beside two other sequences,
    and inside a 400-token prompt chunk beside a decode and a verify run (a mixed step); sequence 1's token at
    position 200 (a row of one run) alone and inside its prompt."""
    from verifier_service.attention.triton_invariant import invariant_attention

    kv_heads, group, head_dim = 3, 3, 64
    context = [1100, 650, 900]
    num_blocks = sum(-(-n // BLOCK) for n in context) + 2
    tables = random_block_tables(num_blocks, context, BLOCK, 3)
    gen = torch.Generator(device="cuda").manual_seed(2)
    shape = (num_blocks, BLOCK, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, device="cuda", generator=gen).bfloat16() for _ in range(2))
    queries = [torch.randn(n, kv_heads * group, head_dim, device="cuda", generator=gen).bfloat16() for n in context]

    def step(sequences: list[int], query_lens: list[int], context_lens: list[int]) -> torch.Tensor:
        query = torch.cat([queries[s][c - n:c] for s, n, c in zip(sequences, query_lens, context_lens)])
        metadata = AttentionMetadata.build(query_lens, context_lens, [tables[s] for s in sequences],
                                           [0] * query.shape[0], BLOCK, "cuda")
        out = invariant_attention(query, k_cache, v_cache, metadata, head_dim ** -0.5)
        reference = ReferenceAttentionBackend().attend(query.float(), k_cache.float(), v_cache.float(), metadata,
                                                       head_dim ** -0.5)
        assert float((out.float() - reference).norm() / reference.norm()) < 0.01
        return out

    decode = step([0], [1], [701])[0]  # 701 keys: three runs, merged by the second kernel
    verify = step([1, 0, 2], [5, 5, 5], [600, 703, 800])[5 + 2]
    mixed = step([2, 0, 1], [1, 400, 5], [900, 1000, 650])[1 + 700 - 600]
    assert bits_equal(decode, verify) and bits_equal(decode, mixed)
    one_run = step([1], [1], [201])[0]  # 201 keys: one run, written by the first kernel
    chunk = step([2, 1], [1, 300], [900, 300])[1 + 200]
    assert bits_equal(one_run, chunk)


# -- the default model through the engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config():
    from specd.default_model import resolve_model_path
    from verifier_service.engine.config import EngineConfig

    try:
        resolve_model_path("default")
    except RuntimeError as error:  # neither the package nor SPECD_DEFAULT_GGUF
        pytest.skip(str(error))
    return EngineConfig(model="default", device="cuda", dtype="bfloat16", block_size=BLOCK,
                        kv_cache_bytes=1 << 30, max_num_seqs=64, adaptive_drafting=False,
                        max_speculative_tokens=8, num_speculative_tokens=0, deterministic=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from bench.deterministic import tokenize

    return tokenize("default", 64)


@pytest.fixture(scope="module")
def runner(config):
    from verifier_service.runners import build_model_runner

    runner = build_model_runner(config)
    assert runner.graphs is not None and runner.pieces is not None and runner.backend.name == "invariant-triton"
    return runner


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, seed=11)


@pytest.fixture(scope="module")
def alone(config, runner, prompts) -> list[list[int]]:
    """Greedy, each prompt by itself, one token per step: plain decoding (its steps replay the decode graph)."""
    outputs = generate(config, runner, prompts[:NUM_PROMPTS], GREEDY, together=False)
    assert runner.last_forward_path == "graph"
    return outputs


@pytest.mark.parametrize("k, together", [(0, True), (4, False), (2, True), (4, True), (8, True)])
def test_greedy_text_is_the_same_with_drafts_and_in_a_batch(config, runner, prompts, alone, k, together):
    assert generate(config, runner, prompts[:NUM_PROMPTS], GREEDY, k, together) == alone


@pytest.mark.parametrize("k", [0, 4])
def test_greedy_text_is_the_same_among_63_others(config, runner, prompts, alone, k):
    assert generate(config, runner, prompts, GREEDY, k)[:NUM_PROMPTS] == alone


KV_BLOCK_BYTES_64 = 1_474_560  # one 64-token block of the default model in bfloat16 (30 layers x K, V x 3 x 64)


def test_greedy_text_is_the_same_after_preemption(config, prompts, alone):
    """Pages of 64 tokens instead of 256, and 7 of them for 8 requests of up to 257 tokens (one more is the CUDA
    graphs' scratch): requests are preempted and recomputed, their KV split into other pages."""
    from drafter_service.local import LocalProposer
    from verifier_service.engine.engine import Engine

    small = dataclasses.replace(config, block_size=64, kv_cache_bytes=8 * KV_BLOCK_BYTES_64, num_speculative_tokens=4,
                                max_num_seqs=8)
    engine = Engine(small, proposer=LocalProposer())
    assert engine.runner.num_blocks == 7 and engine.runner.graphs is not None
    assert generate(small, None, prompts[:NUM_PROMPTS], GREEDY, engine=engine) == alone
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0


def test_seeded_sampling_is_the_same_with_drafts_among_others(config, runner, prompts):
    mine = prompts[:NUM_PROMPTS]
    assert generate(config, runner, prompts, SEEDED, 4)[:NUM_PROMPTS] == generate(config, runner, mine, SEEDED,
                                                                                  together=False)


def test_the_mode_scores_as_the_model_does(runner, prompts):
    """Identical text alone proves nothing if the mode computes something else (a norm's outputs swapped, RoPE not
    applied): its argmax is float32 transformers' over a prompt, but for bfloat16 near-ties."""
    from specd.default_model import resolve_model_path

    assert argmax_agreement(runner, resolve_model_path("default"), prompts[0], BLOCK) >= 0.9


def test_a_second_run_gives_the_same_text(config, prompts, alone):
    from verifier_service.runners import build_model_runner

    assert generate(config, build_model_runner(config), prompts[:NUM_PROMPTS], GREEDY, 4) == alone
