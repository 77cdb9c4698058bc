"""Programmatic dependent launch (verifier_service/kernels/pdl.py) changes no result: a CUDA graph in which every
kernel reads what the kernel right before it wrote (Inductor's kernels, the KV write, split attention and its
combine), launched with PDL, gives bit for bit what the same graph gives without, at every replay with new data
(a kernel that read before its predecessor had finished would read the replay before's values). Each family of
kernels also takes PDL alone, to tell which one a difference comes from. H100 / H200 only: elsewhere PDL is off."""
from __future__ import annotations

import types

import pytest
import torch

from gpu.test_triton_verify import random_verify_step
from verifier_service.kernels import pdl

pytestmark = pytest.mark.gpu
KV_HEADS, GROUP, HEAD_DIM, SPLITS, REPLAYS = 4, 4, 128, 16, 20
FAMILIES = ("inductor", "kv_write", "attention")


def graphed_chain(width: int, replays: list[torch.Tensor], families: tuple[str, ...],
                  monkeypatch) -> list[torch.Tensor]:
    """Each replay's output of: compiled producer -> KV write -> split attention (+ combine) -> compiled consumer,
    the kernels of the given families launched with PDL, the others without."""
    from verifier_service.attention import triton_kv_write, triton_verify

    for family, module in (("kv_write", triton_kv_write), ("attention", triton_verify)):
        monkeypatch.setattr(module, "pdl", types.SimpleNamespace(enabled=lambda device, on=family in families: on))
    query, k_cache, v_cache, metadata = random_verify_step(3, 1, width, KV_HEADS, GROUP, HEAD_DIM)
    options = {"triton.enable_pdl": "inductor" in families}
    produce = torch.compile(lambda x: (x.float() * 0.5 + 1.0).to(x.dtype), fullgraph=True, options=options)
    # pointwise only: a compiled reduction may be tuned to another summation order in the other graph
    consume = torch.compile(lambda x: x.float() * 3.0 + 1.0, fullgraph=True, options=options)
    fresh = torch.empty_like(replays[0])

    def chain() -> torch.Tensor:
        kv = produce(fresh)  # [width, 2, kv_heads, head_dim]
        triton_kv_write.write_kv(kv[:, 0], kv[:, 1], k_cache, v_cache, metadata.slot_mapping)
        out = triton_verify.verify_attention(query, k_cache, v_cache, metadata.block_tables, metadata.context_lens,
                                             HEAD_DIM ** -0.5, width, num_splits=SPLITS)
        return consume(out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles and warms up outside the capture
        chain()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = chain()
    outputs = []
    for values in replays:
        fresh.copy_(values)
        graph.replay()
        outputs.append(result.clone())
    return outputs


@pytest.mark.parametrize("families", [FAMILIES, ("inductor",), ("kv_write", "attention")], ids="+".join)
@pytest.mark.parametrize("width", [1, 5])
def test_a_graph_launched_with_pdl_equals_the_same_graph_without(width, families, monkeypatch):
    pytest.importorskip("triton")
    if not pdl.enabled(torch.device("cuda")):
        pytest.skip("PDL needs compute capability 9 or later")
    gen = torch.Generator(device="cuda").manual_seed(width)
    replays = [torch.randn(width, 2, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()
               for _ in range(REPLAYS)]
    with_pdl = graphed_chain(width, replays, families, monkeypatch)
    without = graphed_chain(width, replays, (), monkeypatch)
    differ = {i: int((a != b).sum()) for i, (a, b) in enumerate(zip(with_pdl, without)) if not torch.equal(a, b)}
    assert not differ, f"replay: elements that differ with PDL ({with_pdl[0].numel()} each): {differ}"
    assert not torch.equal(with_pdl[0], with_pdl[1]), "the replays' new keys did not reach the output"
