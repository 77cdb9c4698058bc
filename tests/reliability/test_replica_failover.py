"""Faults behind the gateway: a verifier replica killed mid-run, and the gateway itself restarted.

A replica's death costs no request while another replica serves: requests without a token move to
it, and streams already producing tokens resume there (prompt + emitted tokens, with the seed and the output
positions so far), so greedy and seeded sampled output is identical to an uninterrupted run (gateway/resume.py),
logprobs included.
"""
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from bench.local_stack import Stack
from specd.v1 import gateway_pb2, gateway_pb2_grpc
from support.e2e_clients import generate, load_report, wait_until_idle

PROMPTS = [f"Count from {n} to 100: {n}, {n + 1}," for n in range(1, 7)]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def stack():
    stack = Stack(num_verifiers=2, with_drafter=False).start()
    yield stack
    stack.stop_cleanly()


@pytest.fixture(scope="module")
def expected(stack) -> dict[str, list[int]]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # batching leaves greedy output unchanged (e2e tests)
        results = pool.map(lambda p: generate(stack.gateway_address, p, MAX_TOKENS, ignore_eos=True), PROMPTS)
    return {p: r.token_ids for p, r in zip(PROMPTS, results)}


SAMPLED = dict(temperature=1.0, top_p=0.95, logprobs=1)


@pytest.fixture(scope="module")
def expected_sampled(stack) -> dict[str, tuple[list[int], list[float]]]:
    """Seeded sampled streams, uninterrupted (their tokens do not depend on the batch: keyed sampling)."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = pool.map(lambda i: stream(stack.gateway_address, PROMPTS[i], threading.Event(), seed=i, **SAMPLED),
                           range(len(PROMPTS)))
    return dict(zip(PROMPTS, results))


def stream(address: str, prompt: str, first_token: threading.Event,
           **sampling) -> tuple[list[int], list[float]]:
    """The stream's token ids and, where it asks for logprobs, each token's logprob (else [])."""
    sampling = {"temperature": 0.0, **sampling}
    request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling)
    token_ids, logprobs = [], []
    with grpc.insecure_channel(address) as channel:
        for response in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120):
            token_ids += response.token_ids
            logprobs += [entry.chosen.logprob for entry in response.logprobs]
            first_token.set()
    return token_ids, logprobs


def test_killing_a_replica_mid_stream_loses_no_request_and_changes_no_token(stack, expected, expected_sampled):
    started = [threading.Event() for _ in PROMPTS + list(expected_sampled)]
    try:
        with ThreadPoolExecutor(len(started) + 2) as pool:
            streams = [pool.submit(stream, stack.gateway_address, p, e) for p, e in zip(PROMPTS, started)]
            sampled = [pool.submit(stream, stack.gateway_address, p, e, seed=i, **SAMPLED)
                       for i, (p, e) in enumerate(zip(expected_sampled, started[len(PROMPTS):]))]
            for event in started:
                assert event.wait(60), "a stream produced no token"
            assert load_report(stack.verifier_addresses[0]).num_running > 0, "verifier-0 serves no stream"
            stack.kill("verifier-0")
            # Requests that arrive after the death, before the router has noticed it, move over too.
            late = [pool.submit(generate, stack.gateway_address, p, MAX_TOKENS, ignore_eos=True)
                    for p in PROMPTS[:2]]
            results = [f.result()[0] for f in streams]
            sampled_results = [f.result() for f in sampled]
            late_results = [f.result().token_ids for f in late]
        assert results == [expected[p] for p in PROMPTS]
        assert [tokens for tokens, _ in sampled_results] == [tokens for tokens, _ in expected_sampled.values()]
        for (tokens, logprobs), (_, uninterrupted) in zip(sampled_results, expected_sampled.values()):
            assert len(logprobs) == len(tokens) == MAX_TOKENS  # none lost or repeated where a stream resumed
            assert logprobs == pytest.approx(uninterrupted, abs=1e-4)
        assert late_results == [expected[p] for p in PROMPTS[:2]]
        resumed_after = [int(n) for n in re.findall(r"after (\d+) tokens; resuming",
                                                    stack.services["gateway"].log_path.read_text())]
        assert any(n > 0 for n in resumed_after), "no stream was resumed mid-way"
        health = httpx.get(f"{stack.http_url}/health", timeout=10)
        assert health.status_code == 200  # one healthy replica is enough to serve
        assert health.json()["verifiers"][stack.verifier_addresses[0]] == "unhealthy"
    finally:
        stack.restart("verifier-0")


def test_a_replica_drained_with_sigterm_finishes_its_streams_and_new_requests_go_elsewhere(stack, expected):
    """A rolling update: SIGTERM stops new work at once, in-flight streams finish within the grace. The replica
    drained is one that serves streams (least-loaded routing may send them all to either)."""
    started = [threading.Event() for _ in PROMPTS]
    drained = None
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            streams = [pool.submit(stream, stack.gateway_address, p, e) for p, e in zip(PROMPTS, started)]
            for event in started:
                assert event.wait(60), "a stream produced no token"
            busy = [i for i, address in enumerate(stack.verifier_addresses) if load_report(address).num_running > 0]
            assert busy, "no replica serves a stream"
            drained = f"verifier-{busy[0]}"
            verifier = stack.services[drained]
            verifier.process.terminate()
            results = [f.result()[0] for f in streams]
            assert verifier.process.wait(timeout=30) == 0
            after = generate(stack.gateway_address, PROMPTS[0], MAX_TOKENS, ignore_eos=True)
        assert results == [expected[p] for p in PROMPTS]
        assert after.token_ids == expected[PROMPTS[0]]
    finally:
        if drained is not None:
            stack.restart(drained)


def test_restarting_the_gateway_leaves_verifiers_serving_and_frees_orphaned_requests(stack, expected):
    verifier_pids = [s.process.pid for n, s in stack.services.items() if n.startswith("verifier")]
    first_token = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        orphan = pool.submit(stream, stack.gateway_address, PROMPTS[0], first_token)
        assert first_token.wait(60)
        stack.kill("gateway")
        with pytest.raises(grpc.RpcError) as caught:
            orphan.result()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    for address in stack.verifier_addresses:  # the gateway's connections died, so the verifiers abort
        wait_until_idle(address)
    stack.restart("gateway")
    assert generate(stack.gateway_address, PROMPTS[1], MAX_TOKENS, ignore_eos=True).token_ids == expected[PROMPTS[1]]
    assert [s.process.pid for n, s in stack.services.items() if n.startswith("verifier")] == verifier_pids
