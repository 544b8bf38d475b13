"""deploy/prometheus/alerts_tpu_health.yml: valid, unit-tested with promtool, written against the series the
exporter serves for ICI link health and throttle scores (from its own code, fed an agent's health read)."""

from __future__ import annotations

import re

import msgspec
import yaml
from conftest import REPO
from promstack import check_and_test_rules, needs_promtool, rules_in

from tpu_tools.exporter.prometheus import process_metrics
from tpu_tools.metrics.records.jobs import ProcessesGroup

RULES = REPO / "deploy" / "prometheus" / "alerts_tpu_health.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "alerts_tpu_health_test.yml"
AGENT = {"pid": 7, "tag": "train", "error": None, "tpu_sdk": {"health": {
    "ici_links": [{"location": "tray1.chip3.ici1.int", "tray": 1, "chip": 3, "port": 1, "kind": "int", "score": 10,
                   "state": "unusable"}],
    "throttle": [{"device": 3, "score": 6, "throttled_percent": 60}], "problems": ["tpu_throttle_score: x"]}}}


def _alerts() -> list[dict]:
    return rules_in(RULES)


@needs_promtool
def test_promtool_checks_and_unit_tests_pass():
    check_and_test_rules(RULES, RULE_TESTS)


def test_every_alert_fires_in_a_case():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {check["alertname"] for case in cases for check in case["alert_rule_test"] if check["exp_alerts"]}
    assert firing == {rule["alert"] for rule in _alerts()} == {
        "TpuToolsIciLinkUnusable", "TpuToolsIciLinkPersistentProblem", "TpuToolsTpuThrottled"}


def test_the_exporter_serves_the_series_the_rules_use_with_the_link_location():
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in process_metrics(msgspec.convert({"agents": [AGENT]}, ProcessesGroup))
               for s in family.samples}
    link = ("tpu_tools_process_ici_link_health", (("chip", "3"), ("link", "tray1.chip3.ici1.int"), ("pid", "7"),
                                                  ("port", "1"), ("tag", "train"), ("tray", "1")))
    assert samples[link] == 10.0
    assert samples[("tpu_tools_process_tpu_throttle_score", (("device", "3"), ("pid", "7"), ("tag", "train")))] == 6
    assert samples[("tpu_tools_process_tpu_health_unreadable_values", (("pid", "7"), ("tag", "train")))] == 1
    used = {name for rule in _alerts() for name in re.findall(r"\b(tpu_tools_[a-z_]+)", rule["expr"])}
    assert used <= {name for name, _ in samples}
