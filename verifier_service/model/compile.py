"""Fewer, fused kernels per decoder layer on CUDA: `torch.compile` of the attention-free regions.

Eagerly, a Qwen3 layer launches ~54 kernels at batch-1 decode (four float32 RMSNorms of ~6 kernels
each, RoPE as roll / mul / add, casts), most of them 1-2 us long: the step is bound by kernel count,
not by the weights it reads. Inductor fuses each region into a few Triton kernels around the cuBLAS
GEMMs. A layer is split as DecoderLayer documents:
  attention_inputs  (residual add + norm -> qkv GEMM -> QK-norm + RoPE)  | compiled
  attend            (KV write + flash-attn)                              | eager: the backend's own kernels
  attention_output  (o GEMM + residual add + norm -> MLP)                | compiled
so the attention backend and its metadata context stay outside the compiled graphs. All layers share
one compiled graph per region (parameters are graph inputs), so start-up compiles a handful of graphs,
not one per layer. Shapes are dynamic in num_tokens (one graph for every batch size), except the token
counts of batch-1 decode and verify steps, which get static graphs (see _compiled);
the compiled code is plain kernels, so CUDA graph capture records it like eager code.

Compiled code rounds differently from eager bf16 code (fused float32 intermediates), so it is used on
CUDA only; the CPU float32 path, which tests hold equal to transformers, never compiles.
"""
from __future__ import annotations

import functools

import torch

from specd import environment
from verifier_service.kernels import pdl
from verifier_service.model.decoder import CausalLM


def compile_regions(model: CausalLM, static_token_counts: set[int] | None = None, sharded: bool = False) -> None:
    """Replaces each layer's two regions and the final add + norm by compiled versions (in place, idempotent).

    static_token_counts: token counts that get their own static graphs (see _compiled); the
    caller's set, read at every call, so the runner can add the widths of the CUDA graphs it captures
    (a batch-1 decode / verify step feeds 1 / k + 1 tokens) before their first forward compiles them.
    sharded: a tensor-parallel rank's model, whose few-row GEMMs stay on cuBLAS unless SPECD_FEW_ROW_GEMMS says
    otherwise (the Triton GEMM has not been measured or tested across ranks).
    """
    static = static_token_counts if static_token_counts is not None else {1}
    # Prefill chunks, decode and verify steps differ only in num_tokens: allow one graph per region
    # and specialisation (single token / many) for each model this process loads.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    decoder, device = model.model, model.lm_head.weight.device
    kind = few_row_kind(device, sharded)
    for layer in decoder.layers:
        if getattr(layer, "compiled", False):
            continue
        layer.attention_inputs = _compiled(layer.attention_inputs, static, device, kind)
        layer.attention_output = _compiled(layer.attention_output, static, device, kind)
        layer.compiled = True
    if not getattr(decoder, "compiled", False):
        decoder.final_norm = _compiled(decoder.final_norm, static, device, kind)
        decoder.compiled = True


# Graphs of a few rows (verify steps, small decode batches) keep cuBLAS for their GEMMs by default.
# Autotuning times each candidate with its weight hot in the L2 cache, where a step reads every layer's
# weights from HBM: it picked Triton templates up to 2x slower there than cuBLAS (docs/BENCHMARKS_ARCHIVE.md
# round 7, H100, Qwen3-0.6B, 5 rows: o_proj 12.0 vs 6.1 us; 1,075 vs 878 us for a step's projections), and
# picked differently from one machine to the next.
# But a cuBLAS kernel launches without PDL: each of a batch-1 k = 4 step's 120 GEMMs (4 a layer) leaves the GPU idle
# while the next kernel launches, and in the engine's loop that step's device time is 1.44-1.48x a decode step's on
# the default model's shapes (H200, docs/BENCHMARKS.md round 35), where its kernels' own times sum to 1.09x.
# SPECD_FEW_ROW_GEMMS (few_rows_decompositions) replaces them: "triton", one fixed-tile Triton GEMM launched with
# PDL (kernels/triton_linear.py, an opaque operator in the graph), the default where PDL is on (few_row_kind), for
# GEMMs of up to TRITON_ROWS_MAX rows in every graph, static or dynamic: alone it is as fast as cuBLAS up to 64 rows
# and 1.09-1.13x slower at 80-128 (bench/few_rows_gemm.py, H200, round 38), but in a step it overlaps its neighbours'
# launches (the default model through the stack, batch 1, k = 4: a step 0.72-0.74 against 0.79-0.84 ms, round 37;
# in the engine's loop, 16 requests at k = 4, 80-row GEMMs: 1.36 against 1.47 ms of device time a step, round 44);
# "reductions", in static graphs of up to REDUCTION_ROWS_MAX rows, a multiply-and-sum that Inductor turns into a
# reduction kernel fused with its neighbours, as it does one-row GEMMs (untuned: with coordinate-descent tuning,
# start-up took over 300 s in its one try).
_FEW_ROWS = {"max_autotune": False, "coordinate_descent_tuning": True}
_ONE_ROW = {"max_autotune": True, "coordinate_descent_tuning": True}  # mode="max-autotune-no-cudagraphs"
TRITON_ROWS_MAX = 128  # the most rows a GEMM computes on the Triton GEMM under "triton"
REDUCTION_ROWS_MAX = 16  # the most rows a static graph's GEMM computes as a reduction under "reductions"


def _reduction(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """a @ b (+ bias) as one multiply-and-sum, in float32 at least (as Inductor decomposes a one-row GEMM)."""
    accumulator = torch.promote_types(a.dtype, torch.float32)
    product = (a.to(accumulator).unsqueeze(2) * b.to(accumulator).unsqueeze(0)).sum(dim=1)
    return (product if bias is None else bias.to(accumulator) + product).to(a.dtype)


def _triton(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """a @ b (+ bias) by kernels/triton_linear.py's GEMM."""
    return torch.ops.specd.few_rows_mm(a, b, bias)


_PRODUCTS = {"triton": _triton, "reductions": _reduction}


def few_rows_max(kind: str) -> int:
    """The most rows a GEMM computes as `kind` says: under "triton" TRITON_ROWS_MAX unless
    SPECD_FEW_ROW_GEMMS_MAX_ROWS says otherwise (the crossover with cuBLAS differs by card and model)."""
    if kind == "reductions":
        return REDUCTION_ROWS_MAX
    return environment.few_row_gemms_max_rows(TRITON_ROWS_MAX)


def _few_rows(product, max_rows: int):
    """aten.mm and aten.addmm decompositions that compute GEMMs of at most max_rows rows (and a linear's bias)
    by product(a, b, bias), leaving every other call to aten. In a graph dynamic in its rows, the comparison is a
    guard: the graph compiles once for each side of max_rows."""
    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return NotImplemented if a.shape[0] > max_rows else product(a, b, None)

    def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
        if a.shape[0] > max_rows or beta != 1 or alpha != 1 or bias.dim() != 1:
            return NotImplemented
        return product(a, b, bias)
    return mm, addmm


def few_rows_decompositions(kind: str) -> dict:
    """Inductor's decompositions, with GEMMs of a few rows as `kind` ("triton" / "reductions") computes them."""
    from torch._inductor.decomposition import select_decomp_table

    from verifier_service.kernels import linear_op  # noqa: F401 (registers torch.ops.specd.few_rows_mm)

    aten = torch.ops.aten
    mm, addmm = _few_rows(_PRODUCTS[kind], few_rows_max(kind))
    return {**select_decomp_table(), aten.mm.default: mm, aten.addmm.default: addmm}


def few_row_kind(device: torch.device, sharded: bool = False) -> str:
    """How compiled graphs compute their GEMMs of a few rows: SPECD_FEW_ROW_GEMMS, by default "triton" where PDL is
    on and the model is not a tensor-parallel rank's, else "cublas"."""
    return environment.few_row_gemms(default="triton" if pdl.enabled(device) and not sharded else "cublas")


@functools.cache
def _few_rows_backend(kind: str, options: tuple):
    """Inductor with few_rows_decompositions(kind) and the given options: one backend object for every layer (Dynamo
    guards on the backend: one per layer would recompile the region for each). Neither cache of compiled graphs keys
    on the decompositions, so these graphs are neither stored nor looked up in them: another process with another
    SPECD_FEW_ROW_GEMMS would be handed them."""
    from torch._inductor.compile_fx import compile_fx

    table = few_rows_decompositions(kind)
    patches = dict(options) | {"fx_graph_cache": False}

    def backend(graph, example_inputs):
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(graph, example_inputs, config_patches=patches, decompositions=table)
    return backend


def _compiled(method, static_token_counts: set[int], device: torch.device, kind: str = "cublas"):
    """method compiled for one token (batch-1 decode), statically for the other given token counts (verify
    steps), and dynamically for everything else; GEMMs of a few rows as `kind` says (SPECD_FEW_ROW_GEMMS): under
    "triton" in the static and the dynamic graphs, under "reductions" in the static ones.

    cuBLAS picks poor kernels for one-row GEMMs of small models: Qwen3-0.6B's o_proj (1024 x 2048) takes
    6.1 us for a 1.4 us weight read on an H100. Inductor rewrites a one-row GEMM as a reduction (tuned by
    coordinate descent, fused with the norm before it): 3.7 us, and a step's projections 692 instead of
    851 us (docs/BENCHMARKS_ARCHIVE.md round 4). Static graphs compile once per token count, during the warm-up /
    CUDA graph capture before the service reports SERVING.
    """
    launch = {"triton.enable_pdl": pdl.enabled(device)}  # Inductor's kernels too (pdl.py)

    def compiled(dynamic: bool, options: dict, decomposed: bool):
        if not decomposed:
            return torch.compile(method, dynamic=dynamic, fullgraph=True, options=options)
        if kind == "reductions":
            options = options | {"coordinate_descent_tuning": False}
        backend = _few_rows_backend(kind, tuple(sorted(options.items())))
        return torch.compile(method, dynamic=dynamic, fullgraph=True, backend=backend)

    dynamic = compiled(True, launch, decomposed=kind == "triton")
    one_row = compiled(False, _ONE_ROW | launch, decomposed=False)
    few_rows = compiled(False, _FEW_ROWS | launch, decomposed=kind != "cublas")

    def run(hidden: torch.Tensor, *args):
        tokens = hidden.shape[0]
        if tokens not in static_token_counts:
            return dynamic(hidden, *args)
        return (one_row if tokens == 1 else few_rows)(hidden, *args)
    return run
