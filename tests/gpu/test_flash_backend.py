"""flash-attn paged attention equals the reference backend on random paged layouts (CUDA, bf16 / fp16)."""
from __future__ import annotations

import random

import pytest
import torch

from engine_model.checkpoints import random_block_tables
from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend

pytestmark = pytest.mark.gpu
BLOCK = 256


def random_layout(seed: int, batch: int, query_lens: list[int] | None = None):
    """cached lengths, query lengths and shuffled block tables of a random step."""
    rng = random.Random(seed)
    cached = [rng.choice([0, rng.randrange(1, 3000)]) if query_lens is None else rng.randrange(1, 3000)
              for _ in range(batch)]
    query = query_lens or [rng.choice([1, 5, rng.randrange(1, 400)]) if c else rng.randrange(1, 600) for c in cached]
    context = [c + q for c, q in zip(cached, query)]
    num_blocks = sum(-(-n // BLOCK) for n in context) + 4
    return cached, query, random_block_tables(num_blocks, context, BLOCK, seed), num_blocks


def run_both(cached, query, tables, num_blocks, heads, kv_heads, head_dim, dtype, seed):
    """Same random data through flash-attn (dtype) and the reference (float32): both outputs in float32."""
    from verifier_service.attention.flash import FlashAttentionBackend

    gen = torch.Generator(device="cuda").manual_seed(seed)
    context = [c + q for c, q in zip(cached, query)]
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for t, c, n in zip(tables, cached, context) for p in range(c, n)]
    metadata = AttentionMetadata.build(query, context, tables, slots, BLOCK, "cuda")
    shape = (num_blocks, BLOCK, kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    v_cache = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    num_tokens = sum(query)
    q = torch.randn(num_tokens, heads, head_dim, device="cuda", generator=gen).to(dtype)
    k = torch.randn(num_tokens, kv_heads, head_dim, device="cuda", generator=gen).to(dtype)
    v = torch.randn(num_tokens, kv_heads, head_dim, device="cuda", generator=gen).to(dtype)
    outputs = []
    for backend, cast in ((FlashAttentionBackend(), dtype), (ReferenceAttentionBackend(), torch.float32)):
        kc, vc = k_cache.to(cast), v_cache.to(cast)
        backend.write_kv(k.to(cast), v.to(cast), kc, vc, metadata.slot_mapping)
        outputs.append(backend.attend(q.to(cast), kc, vc, metadata, head_dim ** -0.5).float())
    return outputs, metadata


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("head_dim, heads, kv_heads", [(64, 9, 3), (128, 16, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_equals_reference_on_random_mixed_steps(seed, head_dim, heads, kv_heads, dtype):
    """Prefill chunks mixed with decode and verify tokens: the varlen path."""
    pytest.importorskip("flash_attn")
    layout = random_layout(seed, batch=1 + seed * 3)
    (flash, reference), metadata = run_both(*layout, heads, kv_heads, head_dim, dtype, seed)
    relative = (flash - reference).norm() / reference.norm()
    assert torch.isfinite(flash).all()
    assert relative < 1e-2, f"relative error {relative:.2e}"


@pytest.mark.parametrize("width", [1, 5])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_flash_equals_reference_on_uniform_verify_steps(width, batch):
    """Every sequence feeds the same number of tokens: the uniform path (Triton, or FA2 with_kvcache)."""
    pytest.importorskip("flash_attn")
    layout = random_layout(batch * 10 + width, batch, query_lens=[width] * batch)
    (flash, reference), metadata = run_both(*layout, 16, 8, 128, torch.bfloat16, seed=width)
    assert metadata.uniform_query_len
    relative = (flash - reference).norm() / reference.norm()
    assert relative < 1e-2, f"relative error {relative:.2e}"


@pytest.mark.parametrize("width", [1, 5, 37])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_flash_write_then_attend_stores_what_the_reference_writes(width, batch):
    """The flash backend's own KV write (the Triton writer) stores exactly the reference's index_copy_ result,
    and attention matches."""
    pytest.importorskip("flash_attn")
    from verifier_service.attention.flash import FlashAttentionBackend

    cached, query, tables, num_blocks = random_layout(batch * 100 + width, batch, query_lens=[width] * batch)
    context = [c + q for c, q in zip(cached, query)]
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for t, c, n in zip(tables, cached, context) for p in range(c, n)]
    metadata = AttentionMetadata.build(query, context, tables, slots, BLOCK, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(width)
    shape = (num_blocks, BLOCK, 8, 128)
    k_cache, v_cache = (torch.randn(shape, device="cuda", generator=gen).bfloat16() for _ in range(2))
    qkv = torch.randn(sum(query), 32, 128, device="cuda", generator=gen).bfloat16()
    q, k, v = qkv.split([16, 8, 8], dim=1)  # column slices, as the model's fused projection gives them
    kc, vc = k_cache.clone(), v_cache.clone()
    flash = FlashAttentionBackend()
    assert flash._kv_writer is not None and flash._kv_writer.supports(k, kc, vc)  # noqa: SLF001 - the Triton writer
    flash.write_kv(k, v, kc, vc, metadata.slot_mapping)
    out = flash.attend(q, kc, vc, metadata, 128 ** -0.5).float()
    reference = ReferenceAttentionBackend()
    reference.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
    assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache)
    expected = reference.attend(q.float(), k_cache.float(), v_cache.float(), metadata, 128 ** -0.5)
    relative = (out - expected).norm() / expected.norm()
    assert relative < 1e-2, f"relative error {relative:.2e}"
