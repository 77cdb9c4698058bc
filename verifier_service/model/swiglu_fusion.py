"""SwiGLU's activation into its down projection, in the compiled graphs whose GEMMs are the Triton GEMM.

A decode step's down projection is an Inductor reduction that computes silu(gate) * up as it reads it. A few-row
step's is kernels/triton_linear.py's GEMM, opaque to Inductor, so the activation was a kernel of its own before it
(one per layer, and its output's round trip through memory). `fuse` rewrites the graph Dynamo captured, before
Inductor sees it: F.linear(F.silu(gate) * up, weight, bias) of at most `max_rows` rows becomes one call of
torch.ops.specd.few_rows_gated_mm, the same GEMM with the activation computed as its input tiles load.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from verifier_service.kernels import linear_op  # noqa: F401 (registers torch.ops.specd.few_rows_gated_mm)


def _rows(node: torch.fx.Node) -> int | None:
    value = node.meta.get("example_value")
    return value.shape[0] if isinstance(value, torch.Tensor) and value.dim() == 2 else None


def _gate_and_up(product: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(gate, up) where `product` is silu(gate) * up (either order)."""
    if product.op != "call_function" or product.target not in (operator.mul, torch.mul) or len(product.args) != 2:
        return None
    for silu, up in (product.args, product.args[::-1]):
        if isinstance(silu, torch.fx.Node) and silu.target is F.silu and not silu.kwargs.get("inplace", False):
            if isinstance(up, torch.fx.Node) and len(silu.args) == 1:
                return silu.args[0], up
    return None


def fuse(graph_module: torch.fx.GraphModule, max_rows: int) -> int:
    """Rewrites graph_module in place; returns how many down projections it fused."""
    fused = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target is not torch._C._nn.linear or not node.args:
            continue
        rows = _rows(node)
        pair = _gate_and_up(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        if pair is None or rows is None or rows > max_rows:
            continue
        weight = node.args[1] if len(node.args) > 1 else node.kwargs["weight"]
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        with graph_module.graph.inserting_before(node):
            call = graph_module.graph.call_function(torch.ops.specd.few_rows_gated_mm.default, (*pair, weight, bias))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph_module.graph.erase_node(node)
        fused += 1
    if fused:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return fused
