"""Ending a call early (client cancel, deadline) aborts the request and frees its KV blocks."""
import time

import grpc

from bench.local_stack import metric_value
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


def test_deadlines_are_counted_as_deadline_exceeded_not_as_aborts(stack):
    """gRPC cancels the gateway's handler when the client's deadline passes; that is not a client abort
    (issue 17, item 11: 10 of 11 such requests were counted as finish_reason="abort")."""
    url = stack.metrics_url("gateway")
    aborts = metric_value(url, "specd_requests_total", finish_reason="abort")
    deadlines = metric_value(url, "specd_request_errors_total", code="DEADLINE_EXCEEDED")
    with grpc.insecure_channel(stack.gateway_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for _ in range(6):
            try:
                for _ in stub.Generate(gateway_pb2.GenerateRequest(**LONG), timeout=0.5):
                    pass
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10  # each request is recorded when its handler ends, just after the client's error
    while metric_value(url, "specd_request_errors_total", code="DEADLINE_EXCEEDED") < deadlines + 6:
        assert time.monotonic() < deadline, "deadline errors not counted as DEADLINE_EXCEEDED"
        time.sleep(0.05)
    assert metric_value(url, "specd_requests_total", finish_reason="abort") == aborts
