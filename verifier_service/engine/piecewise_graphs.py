"""CUDA graphs for the steps the decode / verify graphs do not take: prompt chunks, prompts mixed with decoding
sequences, batches beyond the largest captured one. The model is cut at its attention calls (vLLM V1's piecewise
CUDA graphs): the attention-free pieces are captured once per token-count bucket, attention runs eagerly between
them with the step's own metadata.

Eagerly, such a step calls each layer's two dynamic-shape compiled regions (model/compile.py) through their Python
wrappers, ~0.5 ms of host time a layer whatever the step's size: a 250-token prompt of the default model took
20-23 ms of host time for 1.2 ms of GPU time (docs/BENCHMARKS.md, round 20), and with it the first token of every
request and every step that takes in a new prompt. A replay of a piece costs a few microseconds.

The pieces are DecoderModel.forward cut at each layer's attention over the cache (`self_attn.attend_cached`):
  piece 0      embeddings, the rotary tables, layer 0's attention_inputs and KV write
  piece i      layer i-1's attention_output, then layer i's attention_inputs and KV write   (1 <= i < num_layers)
  piece L      the last layer's attention_output and the final norm
Each piece reads and writes fixed buffers sized for the largest bucket, so every bucket's graphs share them (and one
memory pool for what a piece allocates inside). A step of T tokens takes the smallest bucket B >= T: its first T rows
are the step's, rows T..B hold whatever an earlier step left (valid token ids and positions). Every op of a piece
works row by row (GEMMs, norms, rotary, the embedding lookup, a tensor-parallel all-reduce), so those rows never
reach a real one. The KV write is in the pieces too, at the slots buffer: the step's slots in rows 0..T, the scratch
block (no request owns it, as in the decode graphs) in the rest. Only attention runs eagerly, on the T real rows: one
flash-attn call a layer between two replays (writing K/V eagerly took a Triton launch a layer more).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch

from verifier_service.attention.metadata import current_attention_metadata
from verifier_service.model.decoder import CausalLM
from verifier_service.sharding.shared_tuning import checkpoint

logger = logging.getLogger(__name__)

LARGEST_BUCKET = 2048  # above it a step's GPU time outweighs the wrappers' host time on the models we serve


def token_buckets(max_tokens: int) -> list[int]:
    """16, 32, then about 1.5x apart up to min(max_tokens, LARGEST_BUCKET) rounded up to a bucket: padding costs at
    most half a step's rows, where the GPU time grows with them."""
    largest = min(max_tokens, LARGEST_BUCKET)
    buckets = [16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    return buckets[:next(i for i, b in enumerate(buckets) if b >= largest) + 1]


class PiecewiseGraphs:
    """The captured pieces of `model` per token bucket (see the module docstring); `forward` runs one step."""

    def __init__(self, model: CausalLM, max_tokens: int, scratch_slot: int, device: torch.device):
        self.decoder, self.device, self.scratch_slot = model.model, device, scratch_slot
        self.layers = list(self.decoder.layers)
        self.buckets = token_buckets(max_tokens)
        rows, attention = self.buckets[-1], self.layers[0].self_attn
        dtype, hidden_size = self.decoder.embed_tokens.weight.dtype, model.config.hidden_size
        self._ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self._positions = torch.zeros(rows, dtype=torch.int64, device=device)
        cos, _ = self.decoder.rotary.lookup(self._positions, dtype)
        self._cos, self._sin = torch.zeros_like(cos), torch.zeros_like(cos)
        heads, head_dim = attention.num_heads, attention.head_dim
        self._slots = torch.full((rows,), scratch_slot, dtype=torch.int64, device=device)  # where K/V rows go
        self._q = torch.zeros(rows, heads, head_dim, dtype=dtype, device=device)
        self._attention = torch.zeros_like(self._q)  # each layer's attention output, before o_proj
        self._residual = torch.zeros(rows, hidden_size, dtype=dtype, device=device)
        self._out = torch.zeros_like(self._residual)
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    # -- the pieces (each reads and writes the buffers) ----------------------------------------------

    def _pieces(self) -> list[Callable[[int], None]]:
        """Each piece, called with a bucket's row count."""
        return [self._first, *(partial(self._middle, layer) for layer in range(1, len(self.layers))), self._last]

    def _first(self, rows: int) -> None:
        hidden = self.decoder.embed_tokens(self._ids[:rows])
        cos, sin = self.decoder.rotary.lookup(self._positions[:rows], hidden.dtype)
        self._cos[:rows].copy_(cos)
        self._sin[:rows].copy_(sin)
        self._keep_inputs(0, rows, *self.layers[0].attention_inputs(hidden, None, cos, sin))

    def _middle(self, layer: int, rows: int) -> None:
        hidden, residual = self.layers[layer - 1].attention_output(self._residual[:rows], self._attention[:rows])
        self._keep_inputs(layer, rows, *self.layers[layer].attention_inputs(hidden, residual, self._cos[:rows],
                                                                             self._sin[:rows]))

    def _last(self, rows: int) -> None:
        hidden, residual = self.layers[-1].attention_output(self._residual[:rows], self._attention[:rows])
        self._out[:rows].copy_(self.decoder.final_norm(hidden, residual))

    def _keep_inputs(self, layer: int, rows: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     residual: torch.Tensor) -> None:
        """A layer's keys and values into its cache; its queries and the residual stream into the buffers the next
        eager attention and piece read."""
        self.layers[layer].self_attn.write_kv(k, v, self._slots[:rows])
        self._q[:rows].copy_(q)
        self._residual[:rows].copy_(residual)

    # -- capture and replay --------------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every bucket's pieces, largest first (smaller buckets reuse its pool's memory). Each piece runs once
        off the capture first: a new shape may tune a kernel, which must not happen inside a capture."""
        logger.info("capturing piecewise CUDA graphs for steps of up to %s tokens", self.buckets)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for rows in reversed(self.buckets):
            checkpoint(f"capture of the {rows}-token pieces")  # tensor parallelism: every rank tuned alike
            graphs = []
            for piece in self._pieces():
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    piece(rows)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    piece(rows)
                graphs.append(graph)
            self._graphs[rows] = graphs
        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Resets and drops every captured graph (see GraphedSteps.release)."""
        for graphs in self._graphs.values():
            for graph in graphs:
                graph.reset()
        self._graphs.clear()

    def fits(self, num_tokens: int) -> bool:
        return bool(self._graphs) and num_tokens <= self.max_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """DecoderModel.forward for a step that `fits`, inside its attention_context: hidden [num_tokens, hidden_size],
        a view of a buffer the next forward overwrites (read it before then, on this stream)."""
        tokens = input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= tokens)
        graphs, metadata = self._graphs[bucket], current_attention_metadata()
        self._ids[:tokens].copy_(input_ids)
        self._positions[:tokens].copy_(positions)
        self._slots[:tokens].copy_(metadata.slot_mapping)
        self._slots[tokens:bucket].fill_(self.scratch_slot)  # rows an earlier, longer step's slots may still hold
        q, attention = self._q[:tokens], self._attention[:tokens]
        graphs[0].replay()
        for layer, graph in zip(self.layers, graphs[1:]):
            attention.copy_(layer.self_attn.attend_cached(q, metadata))
            graph.replay()
        return self._out[:tokens]
