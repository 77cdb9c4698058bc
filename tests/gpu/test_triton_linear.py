"""kernels/triton_linear.py's GEMM and the compiled graphs that call it (SPECD_FEW_ROW_GEMMS=triton): it computes
x @ W.T (+ bias) within bf16's rounding of cuBLAS, float32 in float32, any strides, with K split or whole; a row's
bits do not depend on the rows beside it (K split or whole); under "tile" K is split in GEMMs of one row tile only;
and a compiled few-row region that calls it, captured in a CUDA graph and replayed with new data, gives what its
eager twin gives."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (4096, 4096))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("split_k", [True, False])
@pytest.mark.parametrize("block_m", [16, 64])
def test_matches_cublas_and_rows_do_not_depend_on_the_rows_beside_them(block_m, split_k):
    import functools

    from verifier_service.kernels import triton_linear

    linear = functools.partial(triton_linear.linear, split_k=split_k)
    if split_k:  # the narrow shapes do take the split path
        assert [triton_linear.k_split(n, k, block_m) < k for n, k in SHAPES[:4]] == [True] * 4

    gen = torch.Generator(device="cuda").manual_seed(block_m)
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, device="cuda", generator=gen).bfloat16() * 0.05
        bias = torch.randn(out_features, device="cuda", generator=gen).bfloat16()
        x = torch.randn(150, in_features, device="cuda", generator=gen).bfloat16()
        whole = linear(x, weight, bias, block_m=block_m)
        reference = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        torch.testing.assert_close(whole.float(), reference, atol=0.05, rtol=0.02)
        for rows, first in ((1, 0), (1, 77), (5, 60), (16, 3), (64, 80), (130, 20)):
            assert bits_equal(linear(x[first:first + rows], weight, bias, block_m=block_m),
                              whole[first:first + rows]), (out_features, in_features, rows, first)


def test_under_tile_k_is_split_in_gemms_of_one_row_tile_only(monkeypatch):
    from verifier_service.kernels import triton_linear

    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_SPLIT_K", "tile")
    triton_linear._split_k_setting.cache_clear()
    try:
        gen = torch.Generator(device="cuda").manual_seed(5)
        weight = torch.randn(576, 1536, device="cuda", generator=gen) * 0.05  # float32: the two sums' bits differ
        x = torch.randn(64, 1536, device="cuda", generator=gen)
        assert triton_linear.k_split(576, 1536, 16) < 1536
        for rows, split in ((1, True), (5, True), (16, True), (17, False), (64, False)):
            default = triton_linear.linear(x[:rows], weight)
            assert torch.equal(default, triton_linear.linear(x[:rows], weight, split_k=split)), rows
            assert not torch.equal(default, triton_linear.linear(x[:rows], weight, split_k=not split)), rows
    finally:
        triton_linear._split_k_setting.cache_clear()


def test_float32_is_not_tf32_and_strided_inputs_are_read_as_they_lie():
    from verifier_service.kernels.triton_linear import linear

    gen = torch.Generator(device="cuda").manual_seed(3)
    weight = torch.randn(300, 200, device="cuda", generator=gen)
    x = torch.randn(7, 400, device="cuda", generator=gen)[:, ::2]  # a column stride of 2
    out = linear(x, weight)
    torch.testing.assert_close(out, (x.double() @ weight.double().t()).float(), rtol=1e-5, atol=1e-4)
    transposed = weight.t().contiguous().t()  # the weight's rows strided
    assert torch.equal(linear(x, transposed), out)


@pytest.mark.parametrize("split_k", ["0", "1", "tile"])  # SPECD_FEW_ROW_GEMMS_SPLIT_K: whole, split, one tile split
@pytest.mark.parametrize("setting", ["triton", None])  # None: the default where PDL is on (Hopper and later)
@torch.inference_mode()
def test_a_compiled_few_row_region_calls_it_inside_a_cuda_graph(monkeypatch, request, setting, split_k):
    from verifier_service.kernels import pdl, triton_linear
    from verifier_service.model import compile as compile_module

    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_SPLIT_K", split_k)
    triton_linear._split_k_setting.cache_clear()  # read once per process: again for this setting, and after it
    request.addfinalizer(triton_linear._split_k_setting.cache_clear)

    if setting is None:
        if not pdl.enabled(torch.device("cuda")):
            pytest.skip("the default is cuBLAS where PDL is off")
        monkeypatch.delenv("SPECD_FEW_ROW_GEMMS", raising=False)
    else:
        monkeypatch.setenv("SPECD_FEW_ROW_GEMMS", setting)
    calls, kernel = [], triton_linear.linear
    monkeypatch.setattr(triton_linear, "linear", lambda *args, **kwargs: calls.append(1) or kernel(*args, **kwargs))
    gen = torch.Generator(device="cuda").manual_seed(4)
    w1, w2 = (torch.randn(n, k, device="cuda", generator=gen).bfloat16() * 0.05 for n, k in ((1536, 576), (576, 1536)))
    b1 = torch.randn(1536, device="cuda", generator=gen).bfloat16()

    def region(hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(hidden, w1, b1)), w2)

    device = torch.device("cuda")
    run = compile_module._compiled(region, {5}, device, compile_module.few_row_kind(device))
    static = torch.randn(5, 576, device="cuda", generator=gen).bfloat16()
    for _ in range(2):
        run(static)  # compile, then warm up outside the capture
    assert len(calls) >= 4  # both projections, both runs: the region's GEMMs are the Triton kernel's
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static)
    for _ in range(5):
        static.copy_(torch.randn(5, 576, device="cuda", generator=gen).bfloat16())
        graph.replay()
        torch.testing.assert_close(out.float(), region(static).float(), atol=0.05, rtol=0.05)
