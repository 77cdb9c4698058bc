"""The Grafana dashboard: the panels and variables operators rely on, and queries that parse."""
from __future__ import annotations

import re

import promql_parser
import pytest

from support.grafana import all_panels, load_dashboard, panel_queries, substitute
from support.specd_metrics import all_series_names

REQUIRED_PANEL_TITLES = {
    "Acceptance rate",
    "Mean acceptance length",
    "Acceptance rate by draft position",
    "Step stage time percentiles",
    "Tokens per second",
    "Time to first token percentiles",
    "Inter-token latency percentiles",
    "Running and waiting requests",
    "KV cache usage",
    "Preemptions",
    "Drafter propose time percentiles",
    "Drafter fallbacks",
    "Drafted tokens by source",
    "Draft length percentiles",
    "Drafter memory",
    "Error rate by code",
}
SELECTOR = 'namespace=~"$namespace", instance=~"$instance"'

DASHBOARD = load_dashboard()
QUERIES = panel_queries(DASHBOARD)


def test_dashboard_has_the_required_panels():
    titles = {panel["title"] for panel in all_panels(DASHBOARD)}
    assert REQUIRED_PANEL_TITLES <= titles, f"missing panels: {REQUIRED_PANEL_TITLES - titles}"


def test_every_panel_has_a_description_and_queries():
    for panel in all_panels(DASHBOARD):
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        assert panel.get("targets"), f"panel {panel['title']!r} has no queries"


def test_dashboard_declares_datasource_namespace_and_instance_variables():
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["multi"]
        promql_parser.parse(substitute(re.sub(r"^label_values\((.*), \w+\)$", r"\1", variables[name]["definition"])))


def test_dashboard_uses_a_current_schema_and_the_datasource_variable():
    assert DASHBOARD["schemaVersion"] >= 39
    for panel in all_panels(DASHBOARD):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_panel_ids_are_unique():
    ids = [panel["id"] for panel in all_panels(DASHBOARD)]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q.panel_title}/{q.ref_id}" for q in QUERIES])
def test_panel_query_parses_after_macro_substitution(query):
    expr = substitute(query.expr)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    promql_parser.parse(expr)  # raises on a syntax error


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q.panel_title}/{q.ref_id}" for q in QUERIES])
def test_panel_query_filters_by_namespace_and_instance_and_uses_rate_interval(query):
    selectors = re.findall(r"(specd_\w+)(\{[^}]*\})?", query.expr)
    assert selectors, f"no specd metric in {query.expr}"
    for name, labels in selectors:
        assert name in all_series_names(), f"{name} is not a docs/PUBLIC_SURFACE.md metric"
        assert SELECTOR in labels, f"{name} lacks the namespace/instance filter in {query.expr}"
    for window in re.findall(r"\[([^\]]+)\]", query.expr):
        assert window == "$__rate_interval", f"range [{window}] instead of [$__rate_interval]"
