"""The running stack's metrics, after real requests: each service's /metrics has the docs/PUBLIC_SURFACE.md
families and no promtool findings, and a real Prometheus scraping the stack answers every dashboard
query with the numbers the responses reported.

One module, so the stack its module-scoped fixtures start (conftest.py) is shared and stopped early.
"""
from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.grafana import load_dashboard, panel_queries, substitute
from support.prometheus import promtool
from support.specd_metrics import DRAFTER_FAMILIES, GATEWAY_FAMILIES, REQUIRED_STAGES, VERIFIER_FAMILIES

pytestmark = pytest.mark.slow

SERVICES = {"gateway": GATEWAY_FAMILIES, "verifier-0": VERIFIER_FAMILIES, "drafter": DRAFTER_FAMILIES}

QUERIES = panel_queries(load_dashboard())
# The dashboard as an operator would set it: this namespace, all instances, a window covering the test.
SUBSTITUTIONS = {"$namespace": "specd-test", "$instance": ".*", "$__rate_interval": "10m"}


def scrape(stack, service: str) -> str:
    response = httpx.get(stack.metrics_url(service), timeout=10)
    assert response.status_code == 200
    return response.text


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def panel_expr(title: str, ref_id: str = "A") -> str:
    query = next(q for q in QUERIES if q.panel_title == title and q.ref_id == ref_id)
    return substitute(query.expr, SUBSTITUTIONS)


def value(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


# Label values every service knows at start-up, whose series must exist before anything happens (issue 16.4).
KNOWN_LABELS = {
    "specd_requests": ("finish_reason", {"stop", "length", "abort"}),
    "specd_request_errors": ("code", {code.name for code in grpc.StatusCode} - {"OK"}),
    "specd_step_stage_seconds": ("stage", {"schedule", "propose", "score", "verify", "update"}),
    "specd_spec_decode_num_accepted_tokens_per_pos": ("position", {str(p) for p in range(8)}),  # max k: 8
}


@pytest.mark.parametrize("service", SERVICES)
def test_a_fresh_stack_has_a_sample_of_every_contract_family(stack, service):
    """Runs before any request (this module's first tests; `traffic` comes later): an alert on a family
    must be able to tell "zero" from "not scraped"."""
    exposed = families(scrape(stack, service))
    for name in SERVICES[service]:
        assert name in exposed and exposed[name].samples, f"{service} /metrics has no sample of {name}"
        if name in KNOWN_LABELS:
            label, values = KNOWN_LABELS[name]
            assert {s.labels[label] for s in exposed[name].samples} >= values, name


@pytest.mark.parametrize("service", SERVICES)
def test_metrics_expose_the_contract_families_with_their_types(stack, traffic, service):
    exposed = families(scrape(stack, service))
    for name, kind in SERVICES[service].items():
        assert name in exposed, f"{service} /metrics lacks {name}"
        assert exposed[name].type == kind, f"{name} is a {exposed[name].type}, docs/PUBLIC_SURFACE.md says {kind}"


@pytest.mark.parametrize("service", SERVICES)
def test_metrics_pass_promtool_check_metrics(stack, traffic, service):
    result = promtool("check", "metrics", stdin=scrape(stack, service))
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_verifier_times_every_required_stage(stack, traffic):
    histogram = families(scrape(stack, "verifier-0"))["specd_step_stage_seconds"]
    stages = {s.labels["stage"] for s in histogram.samples if s.name.endswith("_count") and s.value > 0}
    assert REQUIRED_STAGES <= stages


def test_verifier_counts_acceptance_by_draft_position(stack, traffic):
    counter = families(scrape(stack, "verifier-0"))["specd_spec_decode_num_accepted_tokens_per_pos"]
    positions = {int(s.labels["position"]): s.value for s in counter.samples if s.name.endswith("_total")}
    assert positions and 0 in positions
    accepted = sum(u["speculative"]["accepted_tokens"] for u in traffic.usages)
    assert sum(positions.values()) == accepted  # every accepted draft token has exactly one position


def test_prometheus_scrapes_every_service(prometheus, traffic):
    up = prometheus.query('up{namespace="specd-test"}')
    assert {r["metric"]["job"]: r["value"][1] for r in up} == \
        {"specd-gateway": "1", "specd-verifier": "1", "specd-drafter": "1"}


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q.panel_title}/{q.ref_id}" for q in QUERIES])
def test_dashboard_query_returns_a_series(prometheus, traffic, query):
    # A labelled counter born with the traffic needs a second scrape before rate() sees it: poll.
    prometheus.wait_for(substitute(query.expr, SUBSTITUTIONS), bool, timeout=15)


def test_dashboard_acceptance_rate_matches_response_usage(prometheus, traffic):
    drafted = sum(u["speculative"]["draft_tokens"] for u in traffic.usages)
    accepted = sum(u["speculative"]["accepted_tokens"] for u in traffic.usages)
    assert drafted > 0, "no drafts scored: the acceptance rate would be vacuous"
    assert value(prometheus.query('sum(specd_spec_decode_num_draft_tokens_total{namespace="specd-test"})')) == drafted
    assert value(prometheus.query('sum(specd_spec_decode_num_accepted_tokens_total{namespace="specd-test"})')) == accepted
    assert value(prometheus.query(panel_expr("Acceptance rate"))) == pytest.approx(accepted / drafted, rel=1e-9)


def test_dashboard_tokens_match_response_usage(prometheus, traffic):
    completion = sum(u["completion_tokens"] for u in traffic.usages)
    generated = prometheus.query('sum(specd_generation_tokens_total{namespace="specd-test"})')
    assert value(generated) == completion


def _loads_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("service", ["gateway", "verifier-0", "drafter"])
def test_only_the_engine_process_loads_torch(stack, traffic, service):
    """After real requests, the gateway's processes, the verifier's serving process and the drafter have never loaded
    torch (each would pay seconds at start-up and hundreds of MB for it); the verifier's engine process has."""
    process = psutil.Process(stack.services[service].process.pid)
    if service == "verifier-0":  # its children: the engine process (and multiprocessing's resource tracker)
        assert any(_loads_torch(child.pid) for child in process.children())
        assert not _loads_torch(process.pid)
    else:
        assert not any(_loads_torch(p.pid) for p in [process, *process.children(recursive=True)])
