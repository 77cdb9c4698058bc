"""The reliability folder's shared stack (support/small_stack.py): a tiny-KV verifier and a gateway."""
import grpc
import pytest

from specd.v1 import gateway_pb2_grpc

from support.small_stack import small_stack as build_small_stack


@pytest.fixture(scope="session")
def small_stack():
    stack = build_small_stack().start()
    yield stack
    stack.stop_cleanly()


@pytest.fixture(scope="module")
def gateway(small_stack):
    """A gRPC Gateway stub on the shared small stack."""
    with grpc.insecure_channel(small_stack.gateway_address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)
