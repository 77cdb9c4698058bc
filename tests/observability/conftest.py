"""One real stack (drafter, verifier, gateway; default model, float32 CPU), scraped by a real Prometheus.

The stack is fresh for this folder, so its counters hold exactly the traffic sent here: the
Prometheus server scrapes every service once before any request, then `traffic` sends a few greedy
completions (prompts that repeat themselves, so n-gram drafts get accepted) and one bad request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import pytest

from bench.local_stack import Stack
from support.prometheus import PrometheusServer, require_binary

NAMESPACE = "specd-test"  # attached to every scraped series, as Kubernetes discovery would
PROMPTS = [
    "Count: one two three four five six, one two three four five six, one two three four five six,",
    "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat sat on the mat.",
    "a b c d e f g a b c d e f g a b c d e f g a b c",
]


@dataclass
class Traffic:
    usages: list[dict]  # the HTTP `usage` of every completed request


@pytest.fixture(scope="module")
def stack():
    stack = Stack(num_verifiers=1).start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory):
    require_binary("prometheus")

    def target(name: str) -> str:
        return stack.metrics_url(name).removeprefix("http://").removesuffix("/metrics")

    server = PrometheusServer(
        targets={"specd-gateway": [target("gateway")], "specd-verifier": [target("verifier-0")],
                 "specd-drafter": [target("drafter")]},
        workdir=tmp_path_factory.mktemp("prometheus"), labels={"namespace": NAMESPACE})
    server.start()
    try:
        server.wait_for_scrapes_after(time.time())  # counters' first samples are the idle zeros
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def traffic(stack, prometheus) -> Traffic:
    usages = []
    with httpx.Client(base_url=stack.http_url, timeout=120) as client:
        for prompt in PROMPTS:
            response = client.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                                             "max_tokens": 16, "temperature": 0})
            assert response.status_code == 200, response.text
            usages.append(response.json()["usage"])
        bad = client.post("/v1/completions", json={"model": "default", "prompt": "x", "max_tokens": -1})
        assert bad.status_code == 400, bad.text  # counted in specd_request_errors_total{code}
    # The verifier exports a step's counts after the step, possibly after its last response went out:
    # wait until a scrape holds the whole traffic, then for one more of every target.
    drafted = sum(u["speculative"]["draft_tokens"] for u in usages)
    prometheus.wait_for(f'sum(specd_spec_decode_num_draft_tokens_total{{namespace="{NAMESPACE}"}}) == {drafted}', bool)
    prometheus.wait_for_scrapes_after(time.time())
    return Traffic(usages)
