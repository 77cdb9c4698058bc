"""Gateway test fixtures: the default model's real tokenizer, loaded once."""
import pytest

from gateway.tokenizer import Tokenizer
from specd.default_model import resolve_model_path


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model_path("default"))
