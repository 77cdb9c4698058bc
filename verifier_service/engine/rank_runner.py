"""One rank's model runner built from the engine's config: the model (or a tensor-parallel rank's shard of it),
its KV cache, compiled regions and CUDA graphs.

runners.build_model_runner calls it for a single-GPU verifier; with tensor parallelism every rank calls it
(parallel/rank_start.py), which is why it sits below both.
"""
from __future__ import annotations

from specd import environment
from specd.default_model import resolve_model_path
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.cuda_graphs import step_widths
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.sharding.shard import RankShard


def build_rank_runner(config: EngineConfig, drafts: bool = True, shard: RankShard | None = None) -> ModelRunner:
    """The runner of `shard` (None: the whole model); with drafts, CUDA graphs for every verify width up to the
    most drafts a request may get."""
    runner = ModelRunner(resolve_model_path(config.model), device=config.device, dtype=config.dtype,
                         block_size=config.block_size, kv_cache_bytes=config.kv_cache_bytes or None,
                         gpu_memory_utilization=config.kv_cache_memory_fraction,
                         max_model_len=config.max_model_len or None, compile_model=config.compile_model,
                         shard=shard, random_weights=config.random_weights, deterministic=config.deterministic)
    if not config.enforce_eager:  # decode and verify steps replay CUDA graphs (a no-op off CUDA / flash-attn)
        drafting_batch = config.max_draft_batch_size if config.adaptive_drafting else 0  # 0: any batch drafts
        pieces = config.max_num_batched_tokens if environment.piecewise_graphs() else 0  # prompt chunks, mixed steps
        runner.capture_cuda_graphs(config.max_num_seqs, step_widths(config.speculative_tokens_limit if drafts else 0),
                                   max_verify_batch=drafting_batch or None, max_piecewise_tokens=pieces)
    return runner
