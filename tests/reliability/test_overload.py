"""Overload: more concurrent requests than the KV cache holds queue, get preempted and still complete
exactly; beyond the bounded queue the answer is RESOURCE_EXHAUSTED / 429; memory stays flat."""
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import psutil
import pytest

from bench.local_stack import metric_value
from support.e2e_clients import generate, greedy_request, load_report, wait_for_load, wait_until_idle
from support.small_stack import CONTEXT, KV_BLOCKS, MAX_WAITING_REQUESTS

PROMPTS = [f"List {n} fruits, one per line, numbered:" for n in (3, 4, 5, 6)]
MAX_TOKENS = 20
SENTENCE = "The quick brown fox jumps over the lazy dog. "  # 11 tokens


@pytest.fixture(scope="module")
def expected(small_stack) -> dict[str, list[int]]:
    """Each prompt's greedy output served alone (the stack's own greedy exactness is e2e's to prove)."""
    return {prompt: generate(small_stack.gateway_address, prompt, MAX_TOKENS).token_ids for prompt in PROMPTS}


def http_completion(client: httpx.Client, url: str, prompt: str) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    return client.post(f"{url}/v1/completions", json=body)


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


def test_a_full_queue_answers_resource_exhausted_and_429_and_the_rest_complete(small_stack, gateway, expected):
    verifier = small_stack.verifier_addresses[0]
    # One long request holds 7+ of the cache's 24 blocks for hundreds of steps; each queued request
    # needs 20 blocks for its prompt, so none is admitted until it ends: the queue stays full.
    runner = gateway.Generate(greedy_request(f"Request 0: {SENTENCE * 10}", CONTEXT - 120, ignore_eos=True),
                              timeout=180)
    wait_for_load(verifier, lambda report: report.num_running == 1)
    queued = [gateway.Generate(greedy_request(f"Request {i}: {SENTENCE * 30}", 8, ignore_eos=True), timeout=180)
              for i in range(1, MAX_WAITING_REQUESTS + 1)]
    wait_for_load(verifier, lambda report: report.num_waiting == MAX_WAITING_REQUESTS)

    refused = grpc_attempt(small_stack, PROMPTS[0])
    with httpx.Client(timeout=60) as client:
        over_http = [http_completion(client, small_stack.http_url, p) for p in PROMPTS]
    report = load_report(verifier)
    assert (report.num_running, report.num_waiting) == (1, MAX_WAITING_REQUESTS), \
        f"the queue moved: {report}\n{small_stack.logs()}"

    for call in [runner, *queued]:
        call.cancel()
    assert isinstance(refused, grpc.RpcError) and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    assert [r.status_code for r in over_http] == [429] * len(PROMPTS), [r.text for r in over_http]
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in over_http)

    # The cancelled requests leave nothing behind, and the verifier serves exactly again.
    assert wait_until_idle(verifier).kv_cache_usage == 0.0
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: generate(small_stack.gateway_address, p, MAX_TOKENS), PROMPTS))
    assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS]


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
