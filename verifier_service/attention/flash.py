"""Paged attention through flash-attn 2 (CUDA, float16 / bfloat16, block_size a multiple of 256).

Three kernels, all reading K/V straight from the paged cache through `block_table`:
- the Triton GQA-packed kernel (triton_verify.py) when every sequence feeds the same number > 1 of query
  tokens (all verifying k drafts: the CUDA-graph verify path): ~2.7x FA2 there, since it reads each key
  once per KV head instead of once per query head. Used when triton imports and the shapes fit it.
- the same kernel for decode steps (one token each) too small to fill the GPU: batch * kv_heads * 2 <= SMs. FA2
  splits the KV of such a step over the block table's whole width (max_model_len, fixed when a CUDA graph is
  captured), so that a batch-1 decode step of 576 keys spent 13.7 us a layer in its split and combine kernels
  (Qwen3-8B, H100), 14.6 at TP = 2; the Triton kernel splits the context each sequence has (docs/BENCHMARKS_ARCHIVE.md,
  round 13). Decode and verify steps of few sequences then also attend with the same kernel.
- `flash_attn_with_kvcache` for the other uniform steps (decode batches that fill the GPU, where FA2 is at the
  KV-read floor): q is reshaped to [batch, query_len, heads, head_dim].
- flash-attn's varlen kernel otherwise (prompt chunks mixed with decoding or verify tokens), with cu_seqlens_q
  over the flattened queries and cu_seqlens_k over the sequences' context lengths. It is called in flash-attn's
  extension itself: `flash_attn_varlen_func` reaches it through an autograd Function and a Python-defined
  torch custom op, host time that every layer of a prompt step paid between its piecewise graphs.
With causal=True both align the mask to the bottom-right corner, so the query at position p of a
sequence with context_len keys sees keys [0, p], which is exactly our causal rule.
New keys and values: one Triton kernel writes both before attending (triton_kv_write.py; index_copy_ without
triton). Letting flash_attn_with_kvcache write them itself in single-token steps (k=, v=, cache_seqlens = the
lengths before the step) saves that kernel but was slower in the decode CUDA graph on an H200: its split
kernel and combine took 11.4 + 6.2 us per layer, decode replay 1.33-1.39 vs 1.22 ms (docs/BENCHMARKS_ARCHIVE.md,
round 5), so it was dropped.
"""
from __future__ import annotations


import torch

from specd import environment
from verifier_service.attention.metadata import AttentionMetadata
from verifier_service.attention.reference import ReferenceAttentionBackend

try:
    from flash_attn import flash_attn_with_kvcache
    from flash_attn.flash_attn_interface import flash_attn_gpu  # the extension's kernels (module docstring)
except ImportError:  # flash-attn is optional: select_backend only picks this backend when it imports
    flash_attn_with_kvcache = flash_attn_gpu = None

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def _load_triton_verify():
    """The triton_verify module, or None without triton (CPU machines never import it: it is lazy)."""
    if not environment.triton_verify():  # "0" keeps FA2 for verify steps (to compare before / after)
        return None
    try:
        from verifier_service.attention import triton_verify
    except ImportError:
        return None
    return triton_verify


def _load_triton_kv_write():
    """The triton_kv_write module, or None without triton."""
    try:
        from verifier_service.attention import triton_kv_write
    except ImportError:
        return None
    return triton_kv_write


class FlashAttentionBackend:
    """flash-attn 2 paged attention (see module docstring)."""

    name = "flash-attn"

    def __init__(self):
        if flash_attn_gpu is None:
            raise RuntimeError("flash-attn is not importable; use the reference backend")
        self._writer = ReferenceAttentionBackend()
        self._triton = _load_triton_verify()
        self._kv_writer = _load_triton_kv_write()
        self._splits: dict[tuple[int, int], int] = {}  # (batch, kv_heads) -> KV splits of the Triton kernel
        # Widths (query tokens per sequence) the Triton kernel takes; None: any that fits its tile. Triton compiles
        # the kernel once per width, ~2.5 s: the model runner keeps it to its CUDA graphs' widths, so that a prompt
        # chunk after cached blocks (37 tokens alone on an H200) is not a compile in the middle of serving.
        self.triton_widths: frozenset[int] | None = None

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """key, value [num_tokens, num_kv_heads, head_dim] -> k_cache, v_cache at slot_mapping [num_tokens]."""
        if self._kv_writer is not None and self._kv_writer.supports(key, k_cache, v_cache):
            self._kv_writer.write_kv(key, value, k_cache, v_cache, slot_mapping)
        else:
            self._writer.write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
        if metadata.uniform_query_len:
            width = metadata.max_seqlen_q
            if self._takes_triton(query, k_cache, width, metadata.batch_size):
                return self._grouped(query, k_cache, v_cache, metadata, scale)
            batched = query.view(metadata.batch_size, metadata.max_seqlen_q, *query.shape[1:])
            out = flash_attn_with_kvcache(
                batched, k_cache, v_cache, cache_seqlens=metadata.context_lens,
                block_table=metadata.block_tables, softmax_scale=scale, causal=True)
            return out.view(query.shape)
        return _varlen(query, k_cache, v_cache, metadata, scale)

    def _takes_triton(self, query: torch.Tensor, k_cache: torch.Tensor, width: int, batch: int) -> bool:
        """Whether a uniform step of `width` tokens per sequence goes to the Triton kernel (module docstring)."""
        if self._triton is None or not self._triton.supports(query, k_cache, width):
            return False
        if self.triton_widths is not None and width not in self.triton_widths:
            return False
        return width > 1 or self._num_splits(batch, k_cache.shape[2], query.device) > 1

    def _num_splits(self, batch: int, kv_heads: int, device: torch.device) -> int:
        if (batch, kv_heads) not in self._splits:
            self._splits[batch, kv_heads] = self._triton.choose_splits(batch, kv_heads, device)
        return self._splits[batch, kv_heads]

    def _grouped(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [batch * width, heads, head_dim] -> same shape, through the Triton GQA-packed kernel."""
        splits = self._num_splits(metadata.batch_size, k_cache.shape[2], query.device)
        return self._triton.verify_attention(
            query, k_cache, v_cache, metadata.block_tables, metadata.context_lens, scale,
            metadata.max_seqlen_q, num_splits=splits)


def _varlen(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, metadata: AttentionMetadata,
            scale: float) -> torch.Tensor:
    """flash_attn_varlen_func(query, k_cache, v_cache, ..., causal=True, block_table=...) without its wrappers."""
    query = query if query.stride(-1) == 1 else query.contiguous()  # the kernel's one layout demand on it
    out, *_ = flash_attn_gpu.varlen_fwd(
        query, k_cache, v_cache, None,  # out: a new tensor
        metadata.cu_seqlens_q, metadata.cu_seqlens_k, None, None,  # seqused_k, leftpad_k
        metadata.block_tables, None,  # alibi_slopes
        metadata.max_seqlen_q, metadata.max_seqlen_k, 0.0, scale,  # dropout_p, softmax_scale
        False, True, -1, -1, 0.0,  # zero_tensors, causal, window left / right, softcap
        False, None)  # return_softmax, generator
    return out
