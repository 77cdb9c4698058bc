"""How many tokens (prompt + output) one request may hold: `max_model_len`, checked against the KV cache.

An explicit --max-model-len that the cache cannot hold for one sequence refuses to start, naming both numbers
and the settings that fix it: served quietly, it would surface as a client's "the context is N tokens"
instead (issue 16). Left unset, the model's own context length is capped at what the cache holds, and the
cap is logged once at start-up.
"""
from __future__ import annotations

import logging

from specd.startup_errors import StartupError
from verifier_service.engine.config import EngineConfig

logger = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, runner) -> int:
    """The context length requests are served with; `runner` has max_model_len, num_blocks and block_size."""
    cache_tokens = runner.num_blocks * runner.block_size  # one sequence may use the whole cache
    asked = min(config.max_model_len or runner.max_model_len, runner.max_model_len)
    if asked <= cache_tokens:
        return asked
    if config.max_model_len:
        raise StartupError(f"--max-model-len {config.max_model_len} needs a KV cache of {asked} tokens for one "
                           f"sequence, but the cache holds {cache_tokens}: {_how_to_grow(config)}, or lower "
                           f"--max-model-len / SPECD_MAX_MODEL_LEN to at most {cache_tokens}")
    logger.warning("max_model_len: serving %d tokens per request, what the KV cache holds (the model's own context "
                   "is %d); %s, or set --max-model-len to make this explicit", cache_tokens, asked,
                   _how_to_grow(config))
    return cache_tokens


def _how_to_grow(config: EngineConfig) -> str:
    if config.device == "cuda" and not config.kv_cache_bytes:  # sized from free GPU memory
        return (f"give the cache more GPU memory (--kv-cache-memory-fraction / SPECD_KV_CACHE_MEMORY_FRACTION, "
                f"now {config.kv_cache_memory_fraction}) or a byte budget (--kv-cache-bytes / SPECD_KV_CACHE_BYTES)")
    return f"raise --kv-cache-bytes / SPECD_KV_CACHE_BYTES (now {config.kv_cache_bytes})"
