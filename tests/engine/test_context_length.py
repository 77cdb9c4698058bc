"""max_model_len against the KV cache (verifier_service/engine/context_length.py, issue 16 item 2): an explicit
length the cache cannot hold refuses to start naming both numbers and the settings; unset, it is capped and
the cap is logged."""
import logging

import pytest

from specd.startup_errors import StartupError
from support.fake_runner import FakePagedRunner
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

CACHE_TOKENS = 16 * 4  # FakePagedRunner(num_blocks=16, block_size=4)


def engine(max_model_len: int, **config) -> Engine:
    runner = FakePagedRunner(num_blocks=16, block_size=4, max_model_len=256)
    return Engine(EngineConfig(max_model_len=max_model_len, num_speculative_tokens=0, **config), runner=runner)


def test_an_explicit_length_the_cache_cannot_hold_refuses_to_start_naming_both_numbers_and_the_settings():
    with pytest.raises(StartupError) as refused:
        engine(max_model_len=100, kv_cache_bytes=4096)
    message = str(refused.value)
    assert "100" in message and str(CACHE_TOKENS) in message
    assert "--kv-cache-bytes" in message and "--max-model-len" in message and "\n" not in message


def test_on_cuda_the_refusal_names_the_memory_fraction():
    with pytest.raises(StartupError, match="--kv-cache-memory-fraction"):
        engine(max_model_len=100, device="cuda", kv_cache_bytes=0)


def test_an_explicit_length_the_cache_holds_is_served_as_asked():
    assert engine(max_model_len=CACHE_TOKENS).max_model_len == CACHE_TOKENS


def test_left_unset_the_models_length_is_capped_at_the_cache_and_the_cap_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        assert engine(max_model_len=0).max_model_len == CACHE_TOKENS
    assert f"serving {CACHE_TOKENS} tokens per request" in caplog.text and "256" in caplog.text
