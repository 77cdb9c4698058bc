"""Overload: more concurrent requests than the KV cache holds queue, get preempted and still complete
exactly; beyond the bounded queue the answer is RESOURCE_EXHAUSTED / 429; memory stays flat."""
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import grpc
import httpx
import psutil
import pytest

from support.e2e_clients import generate, load_report, metric_value
from support.small_stack import KV_BLOCKS, MAX_WAITING_REQUESTS

PROMPTS = [f"List {n} fruits, one per line, numbered:" for n in (3, 4, 5, 6)]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def expected(small_stack) -> dict[str, list[int]]:
    """Each prompt's greedy output served alone (the stack's own greedy exactness is e2e's to prove)."""
    return {prompt: generate(small_stack.gateway_address, prompt, MAX_TOKENS).token_ids for prompt in PROMPTS}


def http_completion(stack, prompt: str) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    return httpx.post(f"{stack.http_url}/v1/completions", json=body, timeout=180)


def grpc_attempt(stack, prompt: str):
    """The generation, or the grpc error it ended with."""
    try:
        return generate(stack.gateway_address, prompt, MAX_TOKENS)
    except grpc.RpcError as error:
        return error


def test_more_requests_than_the_kv_cache_holds_all_complete_exactly(small_stack, expected):
    preemptions = metric_value(small_stack.metrics_url("verifier-0"), "specd_num_preemptions_total")
    prompts = PROMPTS * 5  # 20 requests of ~3 blocks each against a 24-block cache
    assert len(prompts) * 3 > KV_BLOCKS and len(prompts) < MAX_WAITING_REQUESTS
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: generate(small_stack.gateway_address, p, MAX_TOKENS), prompts))
    assert [r.token_ids for r in results] == [expected[p] for p in prompts]
    assert metric_value(small_stack.metrics_url("verifier-0"), "specd_num_preemptions_total") > preemptions
    report = load_report(small_stack.verifier_addresses[0])
    assert report.num_running == 0 and report.num_waiting == 0 and report.kv_cache_usage == 0.0


def test_a_full_queue_answers_resource_exhausted_and_429_and_the_rest_complete(small_stack, expected):
    prompts = PROMPTS * 12  # 48 gRPC + 24 HTTP requests against a queue of 24
    with ThreadPoolExecutor(len(prompts) * 3 // 2) as pool:
        over_grpc = [pool.submit(grpc_attempt, small_stack, p) for p in prompts]
        # The HTTP flood goes out once the queue is full: a refusal returns at once, a served request
        # only after its 20 tokens. (Sent together, HTTP requests could take the queue's places first.)
        wait(over_grpc, return_when=FIRST_COMPLETED)
        over_http = [pool.submit(http_completion, small_stack, p) for p in prompts[: len(prompts) // 2]]
        grpc_results = [f.result() for f in over_grpc]
        http_results = [f.result() for f in over_http]
    refused = [r for r in grpc_results if isinstance(r, grpc.RpcError)]
    assert refused and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused), \
        {r.code() for r in refused}
    assert all(r.token_ids == expected[p] for p, r in zip(prompts, grpc_results) if not isinstance(r, grpc.RpcError))
    assert {r.status_code for r in http_results} <= {200, 429}
    assert any(r.status_code == 429 for r in http_results)
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in http_results if r.status_code == 429)
    assert len(refused) < len(prompts), "nothing was served"


def test_resident_memory_stays_flat_across_many_requests(small_stack):
    verifier = psutil.Process(small_stack.services["verifier-0"].process.pid)
    gateway = psutil.Process(small_stack.services["gateway"].process.pid)
    prompts = [f"Say the word number {i}:" for i in range(120)]

    def run(batch):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: generate(small_stack.gateway_address, p, 8), batch))

    run(prompts[:24])  # warm-up: allocator pools, caches and lazy imports settle first
    start = verifier.memory_info().rss, gateway.memory_info().rss
    run(prompts[24:])
    end = verifier.memory_info().rss, gateway.memory_info().rss
    growth_mib = [(e - s) / 2**20 for s, e in zip(start, end)]
    print("RSS growth MiB (verifier, gateway):", growth_mib)
    # 96 requests: a leak of even 128 KiB per request would show as 12 MiB.
    assert growth_mib[0] < 12 and growth_mib[1] < 12, f"RSS growth (verifier, gateway) MiB: {growth_mib}"
