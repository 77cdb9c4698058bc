"""Reads the Grafana dashboard the chart ships and turns its panel queries into plain PromQL."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_PATH = Path(__file__).resolve().parents[2] / "helm" / "specd" / "dashboards" / "specd.json"

# What Grafana would put in place of its macros and of this dashboard's variables ("All" = ".*").
DEFAULT_SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$namespace": ".*",
    "$instance": ".*",
    "$datasource": "prometheus",
}


@dataclass(frozen=True)
class PanelQuery:
    panel_title: str
    ref_id: str
    expr: str  # as written in the dashboard, macros included


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict:
    return json.loads(path.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def panel_queries(dashboard: dict) -> list[PanelQuery]:
    return [PanelQuery(panel["title"], target["refId"], target["expr"])
            for panel in all_panels(dashboard) for target in panel.get("targets", [])]


def substitute(expr: str, substitutions: dict[str, str] | None = None) -> str:
    """Replaces Grafana macros and variables ($name and ${name}) by values, longest names first."""
    values = {**DEFAULT_SUBSTITUTIONS, **(substitutions or {})}
    for name in sorted(values, key=len, reverse=True):
        bare = name.lstrip("$")
        expr = re.sub(r"\$\{" + re.escape(bare) + r"\}|" + re.escape(name) + r"(?!\w)", values[name], expr)
    return expr
