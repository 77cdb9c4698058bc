"""The reliability folder's shared stack (support/small_stack.py): a tiny-KV verifier and a gateway."""
import pytest

from support.small_stack import small_stack as build_small_stack


@pytest.fixture(scope="session")
def small_stack():
    stack = build_small_stack().start()
    yield stack
    exit_codes = stack.stop()
    assert all(code == 0 for code in exit_codes.values()), f"unclean stop {exit_codes}\n{stack.logs()}"
