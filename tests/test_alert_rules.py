"""deploy/prometheus/alerts.yml: valid, unit-tested with promtool, and written against real metric names."""

from __future__ import annotations

import re

import yaml
from conftest import REPO
from promstack import check_and_test_rules, needs_promtool, rules_in

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"

# A GPU record as the nvml group reports it, to draw the GPU series' names from the exporter's own code.
GPU_RECORD = {"index": 0, "uuid": "GPU-0", "pci_bus_id": "0000:00:06.0", "status": "ok", "memory_used_bytes": 1,
              "memory_total_bytes": 2, "utilization_gpu_percent": 50.0, "temperature_celsius": 40.0,
              "power_draw_watts": 300.0, "ecc_aggregate_uncorrected_errors": 0, "clock_event_reasons": ["gpu_idle"],
              "processes": [{"pid": 7, "kind": "compute", "gpu_memory_bytes": 1, "tag": "t"}], "xid_errors": {"79": 1},
              "pcie_link_width": 8, "pcie_link_width_max": 16, "nvlink_links": 18, "nvlink_links_active": 17}


def _alerts() -> list[dict]:
    return rules_in(RULES)


@needs_promtool
def test_promtool_checks_and_unit_tests_pass():
    checked, tested = check_and_test_rules(RULES, RULE_TESTS)
    assert f"SUCCESS: {len(_alerts())} rules found" in checked
    assert "SUCCESS" in tested


def test_every_alert_has_a_case_where_it_fires():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {check["alertname"] for case in cases for check in case["alert_rule_test"] if check["exp_alerts"]}
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names)) == 20
    assert set(names) == firing


def exported_names() -> set[str]:
    """The names the exporter serves, from its own code fed one device and one agent."""
    import msgspec

    from tpu_tools.exporter.prometheus import device_metrics, host_metrics, process_metrics
    from tpu_tools.metrics.nvml.export import families as gpu_metrics
    from tpu_tools.metrics.records.devices import DevicesRecord
    from tpu_tools.metrics.records.gpu import GpusRecord
    from tpu_tools.metrics.records.host import HostRecord
    from tpu_tools.metrics.records.jobs import ProcessesGroup

    device = {"key": "tpu:0", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": 1, "memory_total_bytes": 2,
              "live_array_bytes": 1, "utilization_percent": 5.0, "holders": [{"pid": 1}]}
    agent = {"pid": 7, "tag": "t", "error": None, "cpu_percent": 1.0, "compiles": {"recompile_count": 1},
             "steps": {"count": 3}}
    families = [*host_metrics(HostRecord(cpu_percent=1.0)),
                *device_metrics(msgspec.convert({"devices": [device]}, DevicesRecord)),
                *process_metrics(msgspec.convert({"agents": [agent]}, ProcessesGroup)),
                *gpu_metrics(msgspec.convert({"gpus": [GPU_RECORD]}, GpusRecord))]
    from tpu_tools.metrics.groups.base import CollectOptions
    from tpu_tools.metrics.groups.diag import DiagGroup
    from tpu_tools.metrics.records.diag import DiagCheck, DiagResult
    from tpu_tools.metrics.records.diag import DiagGroup as DiagGroupRecord

    last = DiagResult(path="diag-last.json", status="fail", age_s=1.0, time_unix_s=1.0, level=1,
                      checks=[DiagCheck(test="compile", device=0, status="fail")])
    families += list(DiagGroup(CollectOptions()).prometheus(DiagGroupRecord(last=last)))
    names = set()
    for family in families:
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names | {"tpu_tools_libtpu_up"}


def test_rules_use_only_series_that_exist():
    exported = exported_names()
    used = {name for rule in _alerts() for name in re.findall(r"\b(tpu_tools_[a-z_]+)", rule["expr"])}
    assert used - exported == set()
    assert {"tpu_tools_process_recompiles_total", "tpu_tools_device_holder_processes", "tpu_tools_gpu_up",
            "tpu_tools_gpu_clock_event_reason", "tpu_tools_gpu_ecc_aggregate_uncorrected_errors_total"} <= used
