"""One real stack (drafter, two verifier replicas, gateway; default model, float32 CPU) for the e2e folder.

Starting a stack costs model loads, so every e2e test shares this one. Tests that disturb it (killing
the drafter) restore it before they end.
"""
import pytest

from support.stack import Stack


@pytest.fixture(scope="session")
def stack():
    stack = Stack(num_verifiers=2).start()
    yield stack
    stack.stop_cleanly()
