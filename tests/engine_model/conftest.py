"""Fixtures for the model-side tests: tiny random checkpoints saved once per module or session."""
from __future__ import annotations

import pytest

from engine_model.checkpoints import TINY_CHECKPOINTS, save_tiny_checkpoint


@pytest.fixture(scope="module", params=sorted(TINY_CHECKPOINTS))
def tiny_checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tiny_checkpoint(request.param, folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder)
    return folder


@pytest.fixture(scope="session")
def default_model_dir():
    from specd.default_model import resolve_model_path

    return resolve_model_path("default")


@pytest.fixture(scope="session")
def default_runner(default_model_dir):
    """The real default model in float32 on the CPU, loaded once for every test that needs it."""
    from verifier_service.engine.model_runner import ModelRunner

    return ModelRunner(default_model_dir, dtype="float32", block_size=16, kv_cache_bytes=32 << 20)
