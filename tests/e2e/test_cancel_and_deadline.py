"""Ending a call early (client cancel, deadline) aborts the request and frees its KV blocks."""
import time

import grpc

from specd.v1 import gateway_pb2, gateway_pb2_grpc
from support.e2e_clients import load_report

LONG = dict(prompt="Count from one to one thousand: one, two, three,", max_tokens=400, temperature=0.0,
            ignore_eos=True)


def used_blocks(stack) -> int:
    return sum(load_report(address).num_used_blocks for address in stack.verifier_addresses)


def wait_for_used_blocks(stack, expected: int, timeout: float = 30.0) -> int:
    """Polls the verifiers' load reports (the report is the observable; there is no event to await)."""
    deadline = time.monotonic() + timeout
    while (used := used_blocks(stack)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return used


def test_cancelling_a_stream_frees_its_kv_blocks(stack):
    baseline = wait_for_used_blocks(stack, 0)
    with grpc.insecure_channel(stack.gateway_address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(**LONG), timeout=120)
        stream = iter(call)
        for _ in range(3):
            next(stream)
        assert used_blocks(stack) > baseline  # the request holds blocks while it runs
        call.cancel()
    assert wait_for_used_blocks(stack, baseline) == baseline


def test_deadline_ends_the_request_and_frees_its_blocks(stack):
    baseline = wait_for_used_blocks(stack, 0)
    started = time.monotonic()
    with grpc.insecure_channel(stack.gateway_address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(**LONG), timeout=1.5)
        try:
            for _ in call:
                pass
            raise AssertionError("a 400-token generation finished within a 1.5 s deadline")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5.0
    assert wait_for_used_blocks(stack, baseline) == baseline
