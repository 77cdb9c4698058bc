"""One real stack (drafter, two verifier replicas, gateway; default model, float32 CPU) for the e2e folder.

Starting a stack costs model loads, so every e2e test shares this one. Tests that disturb it (killing
the drafter) restore it before they end. Its verifiers schedule asynchronously (the CUDA default, off by
default on the CPU), so exactness, cancels, deadlines and failover are checked on that path here; the
stacks of the other folders keep the CPU default.
"""
import pytest

from bench.local_stack import Stack


@pytest.fixture(scope="session")
def stack():
    stack = Stack(num_verifiers=2,
                  extra_args=("--device", "cpu", "--dtype", "float32", "--async-scheduling", "on")).start()
    yield stack
    stack.stop_cleanly()
