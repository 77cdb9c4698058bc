"""CUDA graphs for decode and verify steps: captured once per (batch-size bucket, width), replayed per step.

A decode / verify step feeds every sequence its last token plus up to k drafts, and wants logits for all
of them. Such a step is padded to a captured shape [bucket, width] (width 1 for plain decoding, up to
max k + 1 when drafts are scored; a step takes the narrowest captured width that fits its longest sequence)
and replayed:
- a sequence with fewer tokens than `width` gets padding rows after its real ones. Their K/V go to a
  scratch block that no request owns, and its context length counts them, so with bottom-right causal
  alignment the real rows see exactly their own keys (row r of a sequence starting at position s sees
  keys [0, s + r]) while padding rows read whatever is there and are thrown away;
- batch entries beyond the real batch are whole padding sequences living in the scratch block.
No other sequence's KV is ever written. Prefill chunks, mixed steps and batches larger than the biggest
bucket run eagerly.

Inside the graph: positions, cache slots and context lengths are computed from each sequence's start, real
row count and advance (graph_inputs.step_positions), so a step launched before the previous one's result
reached the host can take that step's accepted counts on the device (async scheduling with drafts); and the
step's greedy verdict is computed after the logits (greedy_verdict.py), so a greedy step needs nothing
launched after the replay but the copy of its result. All per-step inputs reach the GPU in one
host-to-device copy (plus, for steps continuing one still in flight, the small one of previous_tokens.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from verifier_service.attention.metadata import AttentionMetadata, attention_context
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.graph_inputs import GraphGeometry, pack_graph_inputs, section_sizes, step_positions
from verifier_service.engine.greedy_verdict import decode_verdict, greedy_verdict
from verifier_service.engine.previous_tokens import feed_previous_tokens
from verifier_service.sharding.shared_tuning import checkpoint


logger = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return buckets + [max_batch]


def step_widths(max_drafts: int) -> list[int]:
    """Captured widths for steps of up to max_drafts drafts per sequence: 1, 2, 3, 5, 9, ... (2^i + 1) and
    max_drafts + 1. A step pads to the next one: padding rows cost little where a step reads its weights
    once for all rows (small batches), and fewer widths keep start-up (one capture per bucket and width,
    one static compile per width) and graph memory small."""
    widths = {1, max_drafts + 1}
    power = 1
    while power < max_drafts:
        widths.add(power + 1)
        power *= 2
    return sorted(widths)


@dataclass
class GraphStep:
    """The static outputs of one replay (overwritten by the next replay of the same graph)."""

    logits: torch.Tensor  # [bucket * width, vocab] in the model dtype
    rows: torch.Tensor  # [bucket, width + 1]: greedy verdict (greedy_verdict.py)
    continuation: torch.Tensor  # [bucket, 2]: last greedy token and drafts accepted, per sequence


class GraphedSteps:
    """Captured forwards of `model` for decode / verify steps (see the module docstring)."""

    def __init__(self, model, block_size: int, scratch_block: int, max_batch: int, widths: list[int],
                 max_model_len: int, device: torch.device, max_verify_batch: int | None = None,
                 compile_step: bool = False):
        """max_verify_batch: the largest batch that may score drafts (wider steps are captured only up to
        the bucket that holds it: larger steps never draft, draft_policy.py); None = max_batch.
        compile_step: fuse the graph's own small steps (positions, greedy verdict) with torch.compile."""
        self.model, self.block_size, self.scratch_block = model, block_size, scratch_block
        self.device, self.widths = device, sorted(set(widths))
        self.buckets = batch_buckets(max_batch)
        verify_batch = min(max_verify_batch or max_batch, max_batch)
        self.max_verify_bucket = next(b for b in self.buckets if b >= verify_batch)
        self.max_batch, self.max_width = self.buckets[-1], self.widths[-1]
        # Padding rows may reach max_width positions past a sequence's end: keep their blocks in the table.
        self.max_blocks = -(-(max_model_len + self.max_width) // block_size)
        self.geometry = GraphGeometry(block_size, scratch_block, self.max_blocks, max_position=max_model_len - 1)
        # The packed inputs of graph_inputs.py: each step's host buffer lands here in one copy.
        max_size = sum(section_sizes(self.max_batch, self.max_width, self.max_blocks,
                                     num_rows=self.max_batch * self.max_width))
        self._inputs = torch.zeros(max_size, dtype=torch.int64, device=device)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, GraphStep]] = {}
        # A step's own ops are ~25 tiny kernels eagerly (positions, slots, the verdict); fused, a few. Decode steps
        # (width 1) judge nothing: their verdict is a function of its own (greedy_verdict.decode_verdict). Each
        # verdict is compiled twice: for dynamic shapes (every bucket) and, apart, for static ones (one-sequence
        # steps, where the dynamic form's argmax took ~30 us at one row: docs/BENCHMARKS_ARCHIVE.md, round 13).
        self._plain_ops()
        if compile_step:
            self._positions = torch.compile(step_positions, dynamic=True, fullgraph=True)
            self._verdicts = {(verdict, one): torch.compile(verdict, dynamic=not one, fullgraph=True)
                              for verdict, one in self._verdicts}

    def _plain_ops(self) -> None:
        """The step's own ops as plain kernels (without compile, or where compiling them failed). _verdicts: (verdict,
        one sequence?) -> its op."""
        self._positions = step_positions
        self._verdicts = {(verdict, one): verdict for verdict in (greedy_verdict, decode_verdict)
                          for one in (False, True)}

    def _sections(self, bucket: int, width: int, num_rows: int = 0) -> list[torch.Tensor]:
        """ids, starts, counts, advances, block tables, logit rows: views of the static input buffer."""
        sizes = section_sizes(bucket, width, self.max_blocks, num_rows)
        return list(self._inputs[:sum(sizes)].split(sizes))

    # -- capture ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every (bucket, width), largest first so smaller graphs reuse its memory pool."""
        logger.info("capturing CUDA graphs: batches %s, widths %s (above 1 up to batch %d)", self.buckets,
                    self.widths, self.max_verify_bucket)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for width in reversed(self.widths):
            for batch in reversed(self.buckets):
                if width > 1 and batch > self.max_verify_bucket:
                    continue  # steps this large never score drafts
                self._fill_padding(batch, width)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # warm-up run off the capture, as PyTorch advises
                    self._warm_up(batch, width)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                checkpoint(f"capture of the {batch} x {width} graph")  # tensor parallelism: every rank tuned alike
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outputs = self._forward(batch, width)
                self._graphs[(batch, width)] = (graph, outputs)
        torch.cuda.synchronize(self.device)

    def _warm_up(self, batch: int, width: int) -> None:
        """One forward outside the capture (it compiles what is compiled); the step's own ops run eagerly if
        their compiled form fails to build (slower, same result)."""
        try:
            self._forward(batch, width)
        except Exception:  # noqa: BLE001 - an optimisation must not stop the verifier from starting
            if self._positions is step_positions:
                raise
            logger.exception("compiling the %d x %d graph step's own ops failed; they run as plain kernels", batch,
                             width)
            self._plain_ops()
            self._forward(batch, width)

    def _forward(self, batch: int, width: int) -> GraphStep:
        ids, starts, counts, advances, tables, _ = self._sections(batch, width)
        tables = tables.view(batch, self.max_blocks)
        positions, slots, context_lens = self._positions(starts, advances, counts, tables, self.geometry, width)
        with attention_context(self._metadata(batch, width, slots, context_lens, tables)):
            hidden = self.model(ids, positions)
        logits = self.model.compute_logits(hidden)  # [batch * width, vocab] in the model dtype
        verdict = self._verdicts[decode_verdict if width == 1 else greedy_verdict, batch == 1]
        return GraphStep(logits, *verdict(logits, ids.view(batch, width), counts))

    def _metadata(self, batch: int, width: int, slots: torch.Tensor, context_lens: torch.Tensor,
                  tables: torch.Tensor) -> AttentionMetadata:
        """Uniform width, so the flash backend takes its uniform path (the Triton GQA-packed kernel for verify
        steps and for decode steps of few sequences, FA2 with_kvcache for the other decode steps)."""
        cu_q = torch.arange(0, (batch + 1) * width, width, dtype=torch.int32, device=self.device)
        return AttentionMetadata(
            slot_mapping=slots, cu_seqlens_q=cu_q, cu_seqlens_k=cu_q, context_lens=context_lens,
            block_tables=tables.to(torch.int32), max_seqlen_q=width,
            max_seqlen_k=self.max_blocks * self.block_size, block_size=self.block_size)

    def _fill_padding(self, batch: int, width: int) -> None:
        """Capture-time inputs: every sequence a padding sequence in the scratch block."""
        host, _ = pack_graph_inputs([], batch, width, self.geometry, pin_memory=False)
        self._inputs[:host.shape[0]].copy_(host)

    def release(self) -> None:
        """Resets and drops every captured graph (none may be replayed after). Tensor parallelism needs it
        before leaving its process groups: NCCL waits for every graph holding its collectives to go."""
        for graph, _ in self._graphs.values():
            graph.reset()
        self._graphs.clear()

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
        return (bucket, width) if (bucket, width) in self._graphs else None

    def run(self, batch: ScheduledBatch, shape: tuple[int, int]) -> tuple[GraphStep, torch.Tensor | None]:
        """Replays the graph of `shape` on batch: (its outputs, the logit rows of the real tokens [num_logits]
        or None when every row is real)."""
        bucket, width = shape
        host, num_rows = pack_graph_inputs(batch.requests, bucket, width, self.geometry, pin_memory=True)
        self._inputs[:host.shape[0]].copy_(host, non_blocking=True)  # every input in one copy
        ids, _, _, advances, _, rows = self._sections(bucket, width, num_rows)
        feed_previous_tokens(ids, batch, width, advances)  # what the step still in flight emits and accepts
        graph, outputs = self._graphs[shape]
        graph.replay()
        return outputs, (rows if num_rows != bucket * width else None)
