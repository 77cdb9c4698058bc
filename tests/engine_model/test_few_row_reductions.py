"""SPECD_FEW_ROW_REDUCTIONS's decompositions (verifier_service/model/compile.py): a linear of a few rows, traced as
Inductor traces a compiled region, has no GEMM left in it, only a multiply-and-sum (which Inductor turns into one
reduction kernel), and computes the same values; more rows keep their GEMM."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from verifier_service.model.compile import FEW_ROWS_MAX, few_rows_decompositions


def projections(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A biased projection (Qwen2's qkv) and a plain one, as a layer region calls them."""
    return torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, w1, b1)), w2)


def traced_ops(rows: int) -> tuple[set[str], torch.Tensor, tuple]:
    generator = torch.Generator().manual_seed(rows)
    shapes = [(rows, 64), (96, 64), (96,), (32, 96)]
    inputs = tuple(torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes)
    graph = make_fx(projections, decomposition_table=few_rows_decompositions())(*inputs)
    ops = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    return ops, graph(*inputs), inputs


@pytest.mark.parametrize("rows", [2, 5, 9])
def test_a_few_rows_trace_to_reductions_with_the_gemms_values(rows):
    ops, out, inputs = traced_ops(rows)
    assert not {op for op in ops if "mm" in op}, ops
    assert "aten.sum.dim_IntList" in ops
    torch.testing.assert_close(out, projections(*inputs), rtol=1e-12, atol=1e-12)


def test_more_rows_keep_their_gemms():
    ops, out, inputs = traced_ops(FEW_ROWS_MAX + 1)
    assert {"aten.mm.default", "aten.addmm.default"} <= ops, ops
    torch.testing.assert_close(out, projections(*inputs))
