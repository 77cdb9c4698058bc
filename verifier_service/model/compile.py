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
counts of batch-1 decode and verify steps, which get static graphs with autotuned GEMMs (see _compiled);
the compiled code is plain kernels, so CUDA graph capture records it like eager code.

Compiled code rounds differently from eager bf16 code (fused float32 intermediates), so it is used on
CUDA only; the CPU float32 path, which tests hold equal to transformers, never compiles.
"""
from __future__ import annotations

import torch

from verifier_service.model.decoder import CausalLM


def compile_regions(model: CausalLM, static_token_counts: set[int] | None = None) -> None:
    """Replaces each layer's two regions and the final add + norm by compiled versions (in place, idempotent).

    static_token_counts: token counts that get their own static, autotuned graphs (see _compiled); the
    caller's set, read at every call, so the runner can add the widths of the CUDA graphs it captures
    (a batch-1 decode / verify step feeds 1 / k + 1 tokens) before their first forward compiles them.
    """
    static = static_token_counts if static_token_counts is not None else {1}
    # Prefill chunks, decode and verify steps differ only in num_tokens: allow one graph per region
    # and specialisation (single token / many) for each model this process loads.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    decoder = model.model
    for layer in decoder.layers:
        if getattr(layer, "compiled", False):
            continue
        layer.attention_inputs = _compiled(layer.attention_inputs, static)
        layer.attention_output = _compiled(layer.attention_output, static)
        layer.compiled = True
    if not getattr(decoder, "compiled", False):
        decoder.final_norm = _compiled(decoder.final_norm, static)
        decoder.compiled = True


def _compiled(method, static_token_counts: set[int]):
    """method compiled twice: static and autotuned for the given token counts (batch-1 decode and verify
    steps), dynamic for everything else.

    cuBLAS picks poor kernels for one-row GEMMs of small models: Qwen3-0.6B's o_proj (1024 x 2048)
    takes 12.8 us for a 1.0 us weight read on an H200, a layer's four projections 31 us; inductor's
    max-autotune (Triton templates and cuBLAS benchmarked per shape) takes 18 us (bench/gpu_gemm.py).
    Autotuning needs static shapes, so only these few token counts get it (one compile each); it runs
    once, during the warm-up / CUDA graph capture before the service reports SERVING.
    """
    dynamic = torch.compile(method, dynamic=True, fullgraph=True)
    static = torch.compile(method, dynamic=False, fullgraph=True, mode="max-autotune-no-cudagraphs")

    def run(hidden: torch.Tensor, *args):
        return (static if hidden.shape[0] in static_token_counts else dynamic)(hidden, *args)
    return run
