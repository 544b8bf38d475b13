"""The fleet view of a large fleet: hosts from the recording rules' summaries, chips of a few hosts only."""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.fleet.client import Sample
from tpu_tools.metrics.fleet.records import SUMMARY_RECORDS, build_groups, host_key
from tpu_tools.metrics.fleet.source import DETAIL_HOSTS, detail_hosts, detail_query, typed_group
from tpu_tools.metrics.records.devices import DevicesRecord
from tpu_tools.metrics.records.host import HostRecord


def _summary(cluster: str, instance: str, record: str, value: float) -> Sample:
    return Sample({"__name__": record, "cluster": cluster, "instance": instance, "job": "tpu-tools"}, value)


def _host(cluster: str, instance: str, utilization: float) -> list[Sample]:
    # The records carry ratios; the report shows utilization as a percent.
    figures = {"chips": 8, "utilization_percent": utilization / 100, "memory_used_bytes": 80e9, "jobs": 1,
               "memory_total_bytes": 128e9, "steps_per_second": 2.0, "step_time_s": 0.5, "recompiles": 0}
    return [_summary(cluster, instance, record, figures[field]) for record, field in SUMMARY_RECORDS.items()]


def test_hosts_come_from_summaries_and_outliers_are_per_cluster():
    summaries = [s for c, base in (("a", 90.0), ("b", 40.0)) for i in range(100)
                 for s in _host(c, f"n{i}", base if i != 7 else base - 30)]
    up = [Sample({"__name__": "up", "cluster": c, "instance": f"n{i}", "job": "tpu-tools"}, 0.0 if i == 3 else 1.0)
          for c in "ab" for i in range(100)]
    chip = Sample({"__name__": "tpu_tools_device_utilization_ratio", "cluster": "a", "instance": "n7",
                   "job": "tpu-tools", "device": "tpu:0", "platform": "tpu", "name": "v5e"}, 0.6)
    groups = build_groups([chip], up, summaries)
    fleet = groups["fleet"]
    assert len(fleet.hosts) == 200
    assert fleet.hosts_down == ["a/n3", "b/n3"]
    by_host = {h.host: h for h in fleet.hosts}
    assert msgspec.to_builtins(by_host["b/n5"]) == {
        "host": "b/n5", "up": True, "cluster": "b", "chips": 8, "utilization_percent": 40.0,
        "memory_used_bytes": 80_000_000_000, "memory_total_bytes": 128_000_000_000, "jobs": 1,
        "steps_per_second": 2.0, "step_time_s": 0.5, "recompiles": 0, "goodput_percent": None, "outlier": None}
    assert sorted(o.host for o in fleet.outliers) == ["a/n7", "b/n7"]
    assert [d["key"] for d in groups["devices"]["devices"]] == ["a/n7/tpu:0"]
    chosen = detail_hosts(fleet)
    assert len(chosen) == DETAIL_HOSTS
    assert chosen[:2] == ["a/n7", "b/n7"]
    assert {"a/n3", "b/n3"} <= set(chosen)


def test_detail_query_quotes_instances_for_promql():
    query = detail_query(["a/10.0.0.1:9400", 'b/odd"name', "plain"])
    assert query == ('{__name__=~"tpu_tools_.+",instance=~"10\\\\.0\\\\.0\\\\.1:9400|odd\\"name|plain"}')
    assert host_key({"instance": "n1"}) == "n1"
    assert host_key({"instance": "n1", "cluster": "c"}) == "c/n1"


def test_a_series_that_does_not_fit_its_record_is_that_groups_error():
    labels = {"instance": "n1:9100", "job": "tpu-tools", "device": "tpu:0", "platform": "tpu", "name": "TPU v5e"}
    series = [Sample({"__name__": "tpu_tools_device_memory_used_bytes", **labels}, 1.5),  # bytes are whole
              Sample({"__name__": "tpu_tools_device_hlo_queue_size", **labels}, 3.0),
              Sample({"__name__": "tpu_tools_host_cpu_percent", **labels}, 12.5)]
    groups = build_groups(series, [])
    devices = typed_group(groups["devices"], DevicesRecord)
    assert devices.devices == []
    assert devices.error is not None
    assert "does not fit the report" in devices.error
    assert "$.devices[0].memory_used_bytes" in devices.error
    host = typed_group(groups["host"], HostRecord)  # the other groups go on
    assert host.error is None
    assert host.cpu_percent == 12.5
    fitting = typed_group(build_groups(series[1:], [])["devices"], DevicesRecord)
    (device,) = fitting.devices
    assert fitting.error is None
    assert device.host_name() == "n1:9100"
    assert device.extra.hlo_queue_size == 3
