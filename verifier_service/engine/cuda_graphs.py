"""CUDA graphs for decode and verify steps: captured once per (batch-size bucket, width), replayed per step.

A decode / verify step feeds every sequence its last token plus up to k drafts, and wants logits for all
of them. Such a step is padded to a captured shape [bucket, width] (width 1 for plain decoding, k + 1
when drafts are scored) and replayed:
- a sequence with fewer tokens than `width` gets padding rows after its real ones. Their K/V go to a
  scratch block that no request owns, and its context length counts them, so with bottom-right causal
  alignment the real rows see exactly their own keys (row r of a sequence starting at position s sees
  keys [0, s + r]) while padding rows read whatever is there and are thrown away;
- batch entries beyond the real batch are whole padding sequences living in the scratch block.
No other sequence's KV is ever written. Prefill chunks, mixed steps and batches larger than the biggest
bucket run eagerly. All per-step inputs reach the GPU in one host-to-device copy (plus, with async
scheduling, the rows that take the previous step's tokens: previous_tokens.py).
"""
from __future__ import annotations

import torch

from verifier_service.attention.metadata import AttentionMetadata, attention_context
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.graph_inputs import GraphGeometry, pack_graph_inputs, section_sizes
from verifier_service.engine.previous_tokens import feed_previous_tokens


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return buckets + [max_batch]


class GraphedSteps:
    """Captured forwards of `model` for decode / verify steps (see the module docstring)."""

    def __init__(self, model, block_size: int, scratch_block: int, max_batch: int, widths: list[int],
                 max_model_len: int, device: torch.device):
        self.model, self.block_size, self.scratch_block = model, block_size, scratch_block
        self.device, self.widths = device, sorted(set(widths))
        self.buckets = batch_buckets(max_batch)
        self.max_batch, self.max_width = self.buckets[-1], self.widths[-1]
        # Padding rows may reach max_width positions past a sequence's end: keep their blocks in the table.
        self.max_blocks = -(-(max_model_len + self.max_width) // block_size)
        self.geometry = GraphGeometry(block_size, scratch_block, self.max_blocks, max_position=max_model_len - 1)
        max_tokens = self.max_batch * self.max_width
        self._staging = torch.zeros(self._staging_size(self.max_batch, self.max_width), dtype=torch.int64,
                                    device=device)  # [ids, positions, slots, context_lens, tables] packed
        self._ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self._positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self._slots = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self._context_lens = torch.ones(self.max_batch, dtype=torch.int32, device=device)
        self._tables = torch.full((self.max_batch, self.max_blocks), scratch_block, dtype=torch.int32, device=device)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _staging_size(self, batch: int, width: int) -> int:
        return sum(section_sizes(batch, width, self.max_blocks, num_rows=batch * width))

    # -- capture ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every (bucket, width), largest first so smaller graphs reuse its memory pool."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for width in reversed(self.widths):
            for batch in reversed(self.buckets):
                self._fill_padding(batch, width)
                metadata = self._metadata(batch, width)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # warm-up run off the capture, as PyTorch advises
                    self._forward(batch, width, metadata)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = self._forward(batch, width, metadata)
                self._graphs[(batch, width)] = (graph, logits)
        torch.cuda.synchronize(self.device)

    def _forward(self, batch: int, width: int, metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = batch * width
        with attention_context(metadata):
            hidden = self.model(self._ids[:num_tokens], self._positions[:num_tokens])
        return self.model.compute_logits(hidden)  # [batch * width, vocab] in the model dtype

    def _metadata(self, batch: int, width: int) -> AttentionMetadata:
        """Views of the static buffers; uniform width, so the flash backend takes its uniform path
        (FA2 with_kvcache for width 1, the Triton GQA-packed verify kernel for k + 1)."""
        cu_q = torch.arange(0, (batch + 1) * width, width, dtype=torch.int32, device=self.device)
        return AttentionMetadata(
            slot_mapping=self._slots[:batch * width], cu_seqlens_q=cu_q, cu_seqlens_k=cu_q,
            context_lens=self._context_lens[:batch], block_tables=self._tables[:batch],
            max_seqlen_q=width, max_seqlen_k=self.max_blocks * self.block_size, block_size=self.block_size)

    def _fill_padding(self, batch: int, width: int) -> None:
        """Capture-time inputs: every sequence a padding sequence in the scratch block."""
        self._ids.zero_()
        self._positions.zero_()
        self._slots.copy_(self._scratch_slots(self._slots.shape[0]))
        self._context_lens.fill_(width)
        self._tables.fill_(self.scratch_block)

    def _scratch_slots(self, n: int) -> torch.Tensor:
        offsets = torch.arange(n, device=self.device) % self.block_size
        return self.scratch_block * self.block_size + offsets

    # -- replay -----------------------------------------------------------------------------------

    def shape_for(self, batch: ScheduledBatch) -> tuple[int, int] | None:
        """The captured (bucket, width) that fits a decode / verify batch, or None (run it eagerly)."""
        if not self._graphs or len(batch.requests) > self.max_batch:
            return None
        longest = 0
        for request in batch.requests:
            if request.num_logits != request.num_tokens or request.start_position == 0:
                return None  # a prompt chunk: eager
            if len(request.block_table) > self.max_blocks:
                return None
            longest = max(longest, request.num_tokens)
        width = next((w for w in self.widths if w >= longest), None)
        if width is None:
            return None
        bucket = next(b for b in self.buckets if b >= len(batch.requests))
        return bucket, width

    def run(self, batch: ScheduledBatch, shape: tuple[int, int]) -> torch.Tensor:
        """float32 logits [batch.num_logits, vocab], as ModelRunner.execute returns them."""
        bucket, width = shape
        host, num_rows = pack_graph_inputs(batch.requests, bucket, width, self.geometry, pin_memory=True)
        staging = self._staging[:host.shape[0]]
        staging.copy_(host, non_blocking=True)  # every input in one copy (async scheduling adds a small one below)
        n = bucket * width
        ids, positions, slots, context_lens, block_tables, rows = staging.split(
            section_sizes(bucket, width, self.max_blocks, num_rows))
        self._ids[:n].copy_(ids)
        feed_previous_tokens(self._ids, batch, width)  # tokens the previous step sampled, still on the device
        self._positions[:n].copy_(positions)
        self._slots[:n].copy_(slots)
        self._context_lens[:bucket].copy_(context_lens)
        self._tables[:bucket].copy_(block_tables.view(bucket, self.max_blocks))
        graph, logits = self._graphs[shape]
        graph.replay()
        if num_rows == n:
            return logits.float()
        return logits[rows].float()
