"""Runs the target model on a ScheduledBatch: one forward over every scheduled token, logits where needed.

Per step: flatten the batch into input_ids / positions, compute each token's cache slot
(slot = block_table[pos // block_size] * block_size + pos % block_size), build the attention metadata
and the token tensors on the CPU and copy them to the device (no host sync, host_copy.py), run the model
inside the attention context, and apply the LM head only to the rows whose logits the batch asks for
(each request's last `num_logits` tokens).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from verifier_service.attention.backend import select_backend
from verifier_service.attention.invariant import InvariantAttentionBackend
from verifier_service.attention.metadata import AttentionMetadata, attention_context
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.cuda_graphs import GraphedSteps
from verifier_service.engine.kv_cache import KVCache, bytes_per_block, num_blocks_for_budget, num_blocks_for_gpu
from verifier_service.engine.loader import load_model
from verifier_service.engine.piecewise_graphs import PiecewiseGraphs
from verifier_service.engine.previous_tokens import advance_on_device, feed_previous_tokens, may_advance
from verifier_service.host_copy import to_device
from verifier_service.model.compile import compile_regions
from verifier_service.model.config import load_model_config
from verifier_service.model.cpu_linear import onednn_linear_enabled, prepack_linears
from verifier_service.sharding.collectives import min_over_ranks, use_fixed_order, use_one_shot
from verifier_service.sharding.layers import use_fixed_rows
from verifier_service.sharding.one_shot_all_reduce import set_up as set_up_one_shot
from verifier_service.sharding.shard import RankShard

DEFAULT_CPU_KV_CACHE_BYTES = 512 * 1024 * 1024


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
    """'auto' is float32 on the CPU and the checkpoint's dtype (bfloat16 if unknown or float32) on CUDA."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return checkpoint_dtype if checkpoint_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype: {dtype!r} is not one of auto, float32, bfloat16, float16")
    return getattr(torch, dtype)


class ModelRunner:
    """Owns the model and its paged KV cache; `execute` scores one scheduled batch.

    The cache holds `kv_cache_bytes` when given (default 512 MiB on the CPU), else on CUDA what is left
    of `gpu_memory_utilization` of the card once the model is loaded. With `compile_model`, on CUDA only,
    the decoder layers' attention-free regions run as torch.compile'd kernels (model/compile.py); on the
    CPU the linear layers run through oneDNN with prepacked weights (model/cpu_linear.py).

    With `shard` (a tensor-parallel rank, verifier_service/parallel/) the runner holds that rank's part of
    the model and a KV cache of its KV heads, with as many blocks as every other rank; each rank's runner
    executes the same batches (rank 0's ParallelRunner sends them). `random_weights`: see engine/loader.py.
    """

    def __init__(self, model_path: str | Path, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = "auto", block_size: int = 16, kv_cache_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 compile_model: bool = True, shard: RankShard | None = None, random_weights: bool = False,
                 deterministic: bool = False):
        if block_size < 1:
            raise ValueError(f"block_size: {block_size} must be positive")
        self.device = resolve_device(device)
        config = load_model_config(model_path)
        self.dtype = resolve_dtype(dtype, self.device, config.torch_dtype)
        if deterministic:
            _check_deterministic(self.device, self.dtype, shard, config.head_dim, block_size)
        self.max_model_len = max_model_len or config.max_position_embeddings
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len: {self.max_model_len} must be positive")
        self.model = load_model(model_path, self.device, self.dtype, max_position=self.max_model_len, shard=shard,
                                random_weights=random_weights)
        self.config, self.vocab_size, self.block_size = config, config.vocab_size, block_size
        local_config = self.model.config  # a tensor-parallel rank's own heads; the whole model's otherwise
        block_bytes = bytes_per_block(local_config, block_size, self.dtype)
        if kv_cache_bytes is None and self.device.type == "cuda":
            num_blocks = num_blocks_for_gpu(self.device, gpu_memory_utilization, block_bytes)
        else:  # an explicit byte budget wins on any device
            num_blocks = num_blocks_for_budget(kv_cache_bytes or DEFAULT_CPU_KV_CACHE_BYTES, block_bytes)
        if shard is not None:  # block ids are shared by every rank: each must hold all of them
            num_blocks = min_over_ranks(num_blocks, self.device)
            use_fixed_order(deterministic)
            if not deterministic:
                use_one_shot(set_up_one_shot(self.dtype, self.device))  # before any graph captures an all-reduce
        self.kv_cache = KVCache.allocate(local_config, num_blocks, block_size, self.dtype, self.device)
        self.num_blocks = num_blocks
        self.backend = (_invariant_backend(self.device) if deterministic
                        else select_backend(self.device, block_size, self.dtype))
        self.model.bind_kv_cache(self.kv_cache.k_caches, self.kv_cache.v_caches, self.backend)
        self.last_forward_path = "eager"  # how the last execute / execute_greedy ran: graph, piecewise or eager
        self.static_token_counts = {1}  # compiled regions get static graphs of these (capture adds widths)
        self.compiled = compile_model and self.device.type == "cuda" and not deterministic
        if deterministic and self.device.type == "cuda":  # batch-invariant linears and norms (needs triton: lazy)
            from verifier_service.model.invariant_layers import make_batch_invariant

            make_batch_invariant(self.model)
        if self.compiled:  # fused kernels per layer; compiled lazily by the first forward (warm-up / capture)
            compile_regions(self.model, self.static_token_counts, sharded=shard is not None)
        if onednn_linear_enabled(self.device, self.dtype, upcast=deterministic):  # skinny CPU GEMMs (cpu_linear.py)
            prepack_linears(self.model, fixed_rows=DETERMINISTIC_LINEAR_ROWS if deterministic else None)
            if deterministic and shard is not None:
                use_fixed_rows(self.model, DETERMINISTIC_LINEAR_ROWS)
        self.graphs: GraphedSteps | None = None
        self.pieces: PiecewiseGraphs | None = None

    def capture_cuda_graphs(self, max_batch: int, widths: list[int], max_verify_batch: int | None = None,
                            max_piecewise_tokens: int = 0) -> bool:
        """Captures decode / verify steps of up to max_batch sequences and the given widths (1 + drafts);
        widths above 1 only up to max_verify_batch sequences (None: max_batch), the largest that drafts. With
        max_piecewise_tokens, also the model's attention-free pieces for the other steps of up to that many tokens
        (engine/piecewise_graphs.py).

        Only on CUDA with the flash-attn backend or the deterministic mode's Triton one (the reference backend's
        layout depends on the step's lengths). Takes the last KV block as the padding rows' scratch block. Returns
        whether it did.
        """
        if self.device.type != "cuda" or self.backend.name not in GRAPH_BACKENDS or self.num_blocks < 2:
            return False
        self.num_blocks -= 1  # the block manager never hands out the scratch block
        self.static_token_counts.update(widths)  # batch-1 steps of each width: static compiled regions
        if self.backend.name == "flash-attn":  # other widths (prompt chunks) stay on FA2: no JIT mid-serving
            self.backend.triton_widths = frozenset(widths)
        self.graphs = GraphedSteps(self.model, self.block_size, self.num_blocks, max_batch, widths,
                                   self.max_model_len, self.device, max_verify_batch, compile_step=self.compiled)
        self.graphs.capture()
        if max_piecewise_tokens > 0:
            self.pieces = PiecewiseGraphs(self.model, max_piecewise_tokens, self.num_blocks * self.block_size,
                                          self.device)
            self.pieces.capture()
        return True

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [batch.num_logits, vocab_size] in the model's dtype (bf16 on CUDA: the consumers upcast what
        they read, the keyed sampler in registers): per request in order, its last num_logits positions."""
        if not batch:
            raise ValueError("batch: no requests scheduled")
        shape = self._graph_shape(batch)
        if shape is not None:
            self.last_forward_path = "graph"
            outputs, rows = self.graphs.run(batch, shape)
            return outputs.logits.clone() if rows is None else outputs.logits[rows]  # not the graph's buffer
        input_ids, positions, slots, logit_rows = [], [], [], []  # flattened over the batch
        for request in batch.requests:
            first_row = len(input_ids)
            input_ids += request.token_ids
            request_positions = range(request.start_position, request.context_len)
            positions += request_positions
            slots += [request.block_table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in request_positions]
            logit_rows += range(first_row + request.num_tokens - request.num_logits, first_row + request.num_tokens)
        metadata = AttentionMetadata.build(
            query_lens=[r.num_tokens for r in batch.requests], context_lens=[r.context_len for r in batch.requests],
            block_tables=[r.block_table for r in batch.requests], slot_mapping=slots,
            block_size=self.block_size, device=self.device)
        # One host-to-device copy for the token ids, their positions and the rows that need logits.
        packed = to_device(input_ids + positions + logit_rows, torch.int64, self.device)
        token_tensor, position_tensor, row_tensor = packed.split([len(input_ids), len(positions), len(logit_rows)])
        # The tokens the step in flight samples, still on the device; where a start depends on how many of its
        # drafts it accepts, that count moves the positions, slots and context lengths, on the device too.
        advances = (torch.zeros(len(batch.requests), dtype=torch.int64, device=self.device)
                    if may_advance(batch) else None)
        feed_previous_tokens(token_tensor, batch, advances=advances)
        if advances is not None:
            metadata, position_tensor = advance_on_device(batch, metadata, position_tensor, advances)
        piecewise = self.pieces is not None and self.pieces.fits(len(input_ids))
        self.last_forward_path = "piecewise" if piecewise else "eager"
        with attention_context(metadata):  # hidden [num_tokens, hidden_size]
            hidden = (self.pieces.forward if piecewise else self.model)(token_tensor, position_tensor)
        if not logit_rows:
            return torch.empty(0, self.vocab_size, dtype=hidden.dtype, device=self.device)
        return self.model.compute_logits(hidden[row_tensor])

    @torch.inference_mode()
    def execute_greedy(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For a batch that replays a CUDA graph, the graph's own greedy verdict: (rows [n, width + 1],
        continuation [n, 2]) as greedy_verdict.py defines them, one row per request; None otherwise (then
        call execute and verify the logits). Only for batches whose requests all decode greedily."""
        shape = self._graph_shape(batch) if batch else None
        if shape is None:
            return None
        self.last_forward_path = "graph"
        outputs, _ = self.graphs.run(batch, shape)
        n = len(batch.requests)
        return outputs.rows[:n], outputs.continuation[:n]

    def _graph_shape(self, batch: ScheduledBatch) -> tuple[int, int] | None:
        """The captured shape that batch replays (each request checked), or None: run it eagerly."""
        for request in batch.requests:
            self._check(request)
        return self.graphs.shape_for(batch) if self.graphs is not None else None

    def warm_up(self) -> None:
        """Runs a prefill chunk, then a verify step with drafts, so first requests meet no one-time costs.

        It writes only into blocks no request owns yet (the scheduler has admitted none at start-up).
        """
        prefill_len = max(1, min(2 * self.block_size, self.max_model_len - 4))
        verify_len = min(4, self.max_model_len - prefill_len)
        table = list(range(min(self.num_blocks, -(-(prefill_len + verify_len) // self.block_size))))
        if len(table) * self.block_size < prefill_len + verify_len:
            return  # a cache this small is a test set-up, not worth warming
        self.execute(ScheduledBatch([ScheduledRequest("warm-up", [0] * prefill_len, 0, table, 0, 1)]))
        if verify_len:
            drafts = ScheduledRequest("warm-up", [0] * verify_len, prefill_len, table, verify_len - 1, verify_len)
            self.execute(ScheduledBatch([drafts]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Nothing to release in one process (a tensor-parallel runner stops its other ranks here)."""

    def check(self, batch: ScheduledBatch) -> None:
        """Raises ValueError naming the field for a batch `execute` would refuse (what it checks first)."""
        if not batch:
            raise ValueError("batch: no requests scheduled")
        for request in batch.requests:
            self._check(request)

    def _check(self, request: ScheduledRequest) -> None:
        """Bad scheduling surfaces as a clear error naming the field, not as a wrong answer."""
        if not request.token_ids:
            raise ValueError(f"token_ids: request {request.request_id} schedules no tokens")
        if not 0 <= request.num_logits <= request.num_tokens:
            raise ValueError(f"num_logits: {request.num_logits} for {request.num_tokens} tokens "
                             f"in request {request.request_id}")
        if not 0 <= min(request.token_ids) <= max(request.token_ids) < self.vocab_size:
            raise ValueError(f"token_ids: request {request.request_id} has ids outside [0, {self.vocab_size})")
        if request.context_len > self.max_model_len:
            raise ValueError(f"token_ids: request {request.request_id} reaches position {request.context_len}, "
                             f"beyond max_model_len {self.max_model_len}")
        if len(request.block_table) * self.block_size < request.context_len:
            raise ValueError(f"block_table: {len(request.block_table)} blocks of request {request.request_id} "
                             f"do not cover {request.context_len} positions")


DETERMINISTIC_LINEAR_ROWS = 16  # the deterministic mode's one row count per linear (padding costs little below it)
GRAPH_BACKENDS = ("flash-attn", "invariant-triton")  # whose steps' launches depend only on the graph's shape


def _invariant_backend(device: torch.device):
    """The deterministic mode's attention: the Triton kernel on CUDA, the PyTorch one on the CPU."""
    if device.type == "cuda":
        from verifier_service.attention.triton_invariant import InvariantTritonBackend

        return InvariantTritonBackend()
    return InvariantAttentionBackend()


def _check_deterministic(device: torch.device, dtype: torch.dtype, shard: RankShard | None,
                         head_dim: int = 64, block_size: int = 256) -> None:
    """The deterministic mode's batch-invariant kernels exist where this says they do: on CUDA the Triton kernels
    (triton importable, half precision, a cache the attention kernel takes), one process; on the CPU oneDNN's
    linears (model/cpu_linear.py), tensor parallelism included. Elsewhere it refuses to start rather than promise
    what it cannot."""
    if shard is not None and device.type == "cuda":
        raise ValueError("deterministic: not with tensor parallelism on CUDA (its sharded layers have no "
                         "batch-invariant kernels there yet; on the CPU they do)")
    if device.type == "cuda":  # what attention/triton_invariant.py takes: tl.dot on half precision, whole key blocks
        if (dtype not in (torch.float16, torch.bfloat16) or head_dim < 16 or head_dim & (head_dim - 1)
                or block_size % 64):
            raise ValueError(f"deterministic: on CUDA needs bfloat16 or float16, a power-of-two head_dim and KV "
                             f"blocks of a multiple of 64 tokens (got {dtype}, head_dim {head_dim}, "
                             f"block_size {block_size})")
        if importlib.util.find_spec("triton") is None:
            raise ValueError("deterministic: its CUDA kernels need triton, which is not installed")
        return
    if device.type != "cpu":
        raise ValueError(f"deterministic: no batch-invariant kernels for {device.type}")
    if not onednn_linear_enabled(device, dtype, upcast=True):
        raise ValueError(f"deterministic: needs oneDNN linears for {dtype} on this CPU (SPECD_ONEDNN_LINEAR=0 "
                         "switches them off)")
