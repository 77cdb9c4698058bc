"""A dead drafter costs no request: decoding goes on without drafts, counted; a restart restores drafting."""
from concurrent.futures import ThreadPoolExecutor

import grpc

from bench.local_stack import metric_value
from specd.v1 import gateway_pb2, gateway_pb2_grpc
from support.e2e_clients import generate
from support.e2e_clients import hf_greedy as greedy_reference

PROMPT = ("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\n"
          "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n")
MAX_TOKENS = 48


def fallbacks(stack) -> float:
    return sum(metric_value(stack.metrics_url(name), "specd_drafter_fallbacks_total")
               for name in stack.services if name.startswith("verifier"))


def stream_killing_the_drafter(stack) -> list[int]:
    """One greedy stream; the drafter is SIGKILLed after its first message."""
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    token_ids = []
    with grpc.insecure_channel(stack.gateway_address) as channel:
        for index, response in enumerate(gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120)):
            if index == 1 and stack.services["drafter"].process.poll() is None:
                stack.kill("drafter")
            token_ids += response.token_ids
    return token_ids


def test_killing_the_drafter_mid_run_keeps_every_request_exact(stack):
    expected = list(greedy_reference(PROMPT, MAX_TOKENS))
    before = fallbacks(stack)
    try:
        with ThreadPoolExecutor(2) as pool:
            others = pool.submit(lambda: [generate(stack.gateway_address, PROMPT, MAX_TOKENS) for _ in range(2)])
            killed = stream_killing_the_drafter(stack)
            concurrent = others.result()
        assert killed == expected
        assert all(r.token_ids == expected for r in concurrent)
        assert fallbacks(stack) > before
        # With the drafter still down, requests complete without drafts.
        assert generate(stack.gateway_address, PROMPT, 8).token_ids == expected[:8]
    finally:
        if stack.services["drafter"].process.poll() is not None:
            stack.restart("drafter")


def test_restarting_the_drafter_restores_drafting(stack):
    if stack.services["drafter"].process.poll() is not None:
        stack.restart("drafter")
    result = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    # The verifier reconnects in the background: the first steps may still decode without drafts.
    for _ in range(3):
        if result.usage.accepted_tokens > 0:
            break
        result = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    assert result.usage.draft_tokens > 0 and result.usage.accepted_tokens > 0
    assert result.token_ids == list(greedy_reference(PROMPT, MAX_TOKENS))
