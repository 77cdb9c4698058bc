"""The Prometheus recording and alerting rules the chart ships, checked and unit-tested by promtool."""
from __future__ import annotations

from pathlib import Path

import yaml

from support.prometheus import promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "specd" / "rules" / "specd-rules.yaml"
RULES_TEST = ROOT / "tests" / "ops" / "rules_test.yaml"


def test_rule_file_passes_promtool_check():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_unit_tests_pass():
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_file_records_speculation_ratios_and_throughput():
    records = {rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"]
               for rule in group["rules"] if "record" in rule}
    assert {"namespace:specd_spec_decode_acceptance_rate:ratio_rate5m",
            "namespace:specd_spec_decode_mean_acceptance_length:ratio_rate5m",
            "namespace:specd_generation_tokens:rate5m"} <= records


def test_every_alert_is_unit_tested():
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    tested = {case["alertname"] for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    assert alerts == tested
