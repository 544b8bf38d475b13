"""deploy/prometheus/records.yml: valid, unit-tested with promtool, read by the fleet view and the dashboards."""

from __future__ import annotations

import re

import yaml
from conftest import REPO
from promstack import check_and_test_rules, needs_promtool, rules_in
from test_alert_rules import exported_names

from tpu_tools.metrics.fleet.records import SUMMARY_RECORDS

RECORDS = REPO / "deploy" / "prometheus" / "records.yml"
RECORD_TESTS = REPO / "deploy" / "prometheus" / "records_test.yml"


def _rules() -> list[dict]:
    return rules_in(RECORDS)


@needs_promtool
def test_promtool_checks_and_unit_tests_pass():
    checked, _ = check_and_test_rules(RECORDS, RECORD_TESTS)
    assert f"SUCCESS: {len(_rules())} rules found" in checked


def test_every_record_is_tested_read_and_built_from_real_series():
    records = {rule["record"] for rule in _rules()}
    tested = {check["expr"] for case in yaml.safe_load(RECORD_TESTS.read_text())["tests"]
              for check in case["promql_expr_test"]}
    assert records == tested
    assert set(SUMMARY_RECORDS) <= records  # the fleet view's summaries
    dashboards = " ".join(path.read_text() for path in (REPO / "deploy" / "grafana").glob("*.json"))
    assert "instance:tpu_tools_device_utilization_ratio:distance_from_cluster_median" in dashboards
    used = {name for rule in _rules() for name in re.findall(r"(?<![:\w])(tpu_tools_[a-z_]+)", rule["expr"])}
    assert used
    assert used - exported_names() == set()
