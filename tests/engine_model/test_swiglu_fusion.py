"""model/swiglu_fusion.py: in a region Dynamo captured, a SwiGLU MLP's down projection of a few rows becomes one call of
torch.ops.specd.few_rows_gated_mm (the Triton GEMM with the activation in its loads, on CUDA), with the same values;
more rows, and linears whose input is not silu(gate) * up, keep their graph."""
from types import SimpleNamespace

import pytest
import torch

from verifier_service.model.layers import MLP
from verifier_service.model.swiglu_fusion import fuse


class Captured:
    """A torch.compile backend that keeps the graph Dynamo hands it (fused) and runs it as it is."""

    def __init__(self, max_rows: int):
        self.max_rows, self.graph, self.fused = max_rows, None, None

    def __call__(self, graph_module, example_inputs):
        self.fused = fuse(graph_module, self.max_rows)
        self.graph = graph_module
        return graph_module.forward


def mlp(bias: bool) -> MLP:
    torch.manual_seed(0)
    module = MLP(SimpleNamespace(hidden_size=64, intermediate_size=96, mlp_bias=bias)).double()
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    return module


@pytest.mark.parametrize("bias", [False, True])
def test_a_few_rows_down_projection_is_one_gated_call_with_the_same_values(bias):
    module, backend = mlp(bias), Captured(max_rows=16)
    x = torch.randn(5, module.gate_up_proj.in_features, dtype=torch.float64)
    out = torch.compile(module.forward, backend=backend, dynamic=False, fullgraph=True)(x)
    targets = [str(node.target) for node in backend.graph.graph.nodes if node.op == "call_function"]
    assert backend.fused == 1 and targets.count("specd.few_rows_gated_mm.default") == 1, targets
    assert not any("silu" in target or target == "<built-in function mul>" for target in targets), targets
    torch.testing.assert_close(out, module(x), rtol=1e-12, atol=1e-12)


def test_more_rows_keep_their_graph():
    module, backend = mlp(False), Captured(max_rows=4)
    x = torch.randn(5, module.gate_up_proj.in_features, dtype=torch.float64)
    torch.compile(module.forward, backend=backend, dynamic=False, fullgraph=True)(x)
    targets = [str(node.target) for node in backend.graph.graph.nodes if node.op == "call_function"]
    assert backend.fused == 0 and "specd.few_rows_gated_mm.default" not in targets


def test_a_linear_of_another_input_is_left_alone():
    def plain(x, w):
        return torch.nn.functional.linear(torch.nn.functional.silu(x) + x, w)

    backend = Captured(max_rows=16)
    x, w = torch.randn(3, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    torch.compile(plain, backend=backend, dynamic=False, fullgraph=True)(x, w)
    assert backend.fused == 0
