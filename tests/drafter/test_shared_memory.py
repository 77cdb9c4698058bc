"""One real drafter, two real DrafterClient streams (two verifiers) on loopback: what one verifier's requests
produced drafts the other's, within the memory's scope, and the drafter's metrics say where drafts came from."""
from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from drafter_service.config import DrafterConfig
from support.drafter_servers import SERVED_OUTPUT, SERVED_PROMPT, ThreadedDrafter, connected, serve_and_release
from drafter_service.client import DrafterClient
from verifier_service.engine.proposer import DraftRequest

pytestmark = pytest.mark.timeout(60)

PROMPT, OUTPUT = SERVED_PROMPT, SERVED_OUTPUT
OTHER_PROMPT = [7, 8]


def config(scope: str) -> DrafterConfig:
    return DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, memory_scope=scope)


def starts_the_same_answer(client: DrafterClient, request_id: str, tenant: str = "") -> list[int]:
    return client.propose([DraftRequest(request_id, OTHER_PROMPT + OUTPUT[:6], 4, tenant_key=tenant)]).get(request_id, [])


def metrics(drafter: ThreadedDrafter) -> dict:
    body = urllib.request.urlopen(f"http://127.0.0.1:{drafter.server.metrics_port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def test_every_drafter_series_exists_at_zero_from_start_up():
    with ThreadedDrafter(config("global")) as drafter:
        exposed = metrics(drafter)
    assert exposed[("specd_drafter_proposed_tokens_total", (("source", "context"),))] == 0
    assert exposed[("specd_drafter_proposed_tokens_total", (("source", "memory"),))] == 0
    assert exposed[("specd_drafter_memory_tokens", ())] == 0
    assert exposed[("specd_drafter_draft_length_count", ())] == 0
    assert exposed[("specd_drafter_draft_length_bucket", (("le", "+Inf"),))] == 0


def test_a_request_on_one_verifier_drafts_from_what_another_verifier_produced():
    with ThreadedDrafter(config("global")) as drafter:
        verifier_a, verifier_b = connected(drafter.address), connected(drafter.address)
        try:
            assert starts_the_same_answer(verifier_b, "before") == []
            serve_and_release(verifier_a, "a-1")
            assert starts_the_same_answer(verifier_b, "b-1") == OUTPUT[6:10]
            exposed = metrics(drafter)
        finally:
            verifier_a.close()
            verifier_b.close()
    assert exposed[("specd_drafter_proposed_tokens_total", (("source", "memory"),))] == 4
    assert exposed[("specd_drafter_proposed_tokens_total", (("source", "context"),))] > 0
    assert exposed[("specd_drafter_memory_tokens", ())] == len(PROMPT) + len(OUTPUT)  # with the prompt's end
    assert exposed[("specd_drafter_draft_length_bucket", (("le", "4.0"),))] >= 1


def test_per_key_scope_keeps_tenants_apart_across_verifiers():
    with ThreadedDrafter(config("per-key")) as drafter:
        verifier_a, verifier_b = connected(drafter.address), connected(drafter.address)
        try:
            serve_and_release(verifier_a, "alice-1", tenant="alice")
            assert starts_the_same_answer(verifier_b, "bob-1", tenant="bob") == []
            assert starts_the_same_answer(verifier_b, "anonymous-1") == []
            assert starts_the_same_answer(verifier_b, "alice-2", tenant="alice") == OUTPUT[6:10]
        finally:
            verifier_a.close()
            verifier_b.close()
