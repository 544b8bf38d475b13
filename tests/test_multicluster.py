"""Many clusters, one store: two per-cluster Prometheus in agent mode remote-write into a central one.

Each cluster's agent scrapes three exporters (the real ReportCollector and /metrics server, in this process,
serving synthetic reports of 4-chip hosts: no TPU here) and labels its series with `cluster` (external
labels). The fleet view and the dashboards' queries run against the central Prometheus: hosts named per
cluster, outliers per cluster, a cluster that stops writing named, a central store that goes away reported
on one line with the last figures kept.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import as_report, report_document
from programs import require_program
from promstack import RECORD_RULES, PrometheusServer, needs_prometheus

from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector
from tpu_tools.exporter.webserver import Limits, MetricsServer, serve_metrics
from tpu_tools.metrics.fleet.source import FleetSource
from tpu_tools.top.frame import render
from tpu_tools.top.model import ViewState

GIB = 1 << 30
# Duty cycle of each host: in each cluster one slow worker, told apart within its own cluster only.
CLUSTERS = {"east": [90.0, 88.0, 40.0], "west": [20.0, 60.0, 62.0]}


def host_report(duty: float, pid: int) -> dict:
    devices = [{"key": f"tpu:{c}", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": 8 * GIB,
                "memory_total_bytes": 16 * GIB, "utilization_percent": duty, "holders": [{"pid": pid}]}
               for c in range(4)]
    agent = {"pid": pid, "tag": "train", "error": None, "cpu_percent": 99.0, "rss_bytes": GIB,
             "steps": {"count": 100, "steps_per_second": 2.0, "p50_step_time_s": 0.5},
             "compiles": {"recompile_count": 1}, "devices": []}
    return {"host": {"error": None, "cpu_percent": 20.0, "memory_total_bytes": 64 * GIB},
            "devices": {"error": None, "devices": devices}, "processes": {"error": None, "agents": [agent]}}


def remote_write(central: PrometheusServer) -> str:
    return (f"remote_write:\n  - url: {central.url}/api/v1/write\n    queue_config:\n"
            "      batch_send_deadline: 200ms\n      min_backoff: 50ms\n      max_backoff: 500ms\n")


class Clusters:
    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="clusters", dir="/tmp"))
        self.exporters: dict[str, list[MetricsServer]] = {}
        self.agents: dict[str, PrometheusServer] = {}
        (self.workdir / "central").mkdir()
        self.central = PrometheusServer(self.workdir / "central", {}, rule_files=[RECORD_RULES],
                                        flags=("--web.enable-remote-write-receiver",))

    def start(self) -> Clusters:
        try:
            self.central.start()
            for cluster, duties in CLUSTERS.items():
                collectors = []
                for index, duty in enumerate(duties):
                    collector = ReportCollector(dict(BUILTIN))
                    collector.update(as_report(host_report(duty, 100 + index)))
                    collectors.append(collector)
                self.exporters[cluster] = [serve_metrics(c, "127.0.0.1", 0, limits=Limits(workers=1))
                                           for c in collectors]
                targets = [f"127.0.0.1:{s.server_address[1]}" for s in self.exporters[cluster]]
                (self.workdir / cluster).mkdir()
                agent = PrometheusServer(self.workdir / cluster, {"tpu-tools": targets}, agent=True,
                                         extra_config=remote_write(self.central))
                config = agent.config.read_text().replace(
                    "global:\n", f"global:\n  external_labels:\n    cluster: {cluster}\n", 1)
                agent.config.write_text(config)
                self.agents[cluster] = agent.start()
            self.central.wait_for("tpu_tools_device_utilization_ratio", count=24, timeout=60)
            self.central.wait_for("instance:tpu_tools_device_utilization_ratio:distance_from_cluster_median",
                                  count=6, timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        store_gone = not self.central.running
        for agent in self.agents.values():
            if store_gone:
                agent.kill()
            else:
                agent.stop()
        self.central.stop()
        for servers in self.exporters.values():
            for server in servers:
                server.shutdown()
                server.server_close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _clusters() -> Iterator[Clusters]:
    require_program("prometheus")
    started = Clusters().start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def clusters() -> Iterator[Clusters]:
    """Shared by the tests that only read."""
    yield from _clusters()


@pytest.fixture
def own_clusters() -> Iterator[Clusters]:
    """For a test that stops a cluster and the store."""
    yield from _clusters()


def until(build, predicate, timeout: float = 60.0) -> dict:
    """Reports from `build()` until one satisfies `predicate` (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        report = report_document(build())
        if predicate(report):
            return report
        if time.monotonic() > deadline:
            raise AssertionError(json.dumps(report.get("fleet"), indent=1)[:3000])
        time.sleep(0.2)


@needs_prometheus
def test_fleet_view_names_hosts_and_outliers_per_cluster(clusters):
    source = FleetSource(clusters.central.url, timeout_s=10)
    report = until(source.build, lambda r: len(r["fleet"]["hosts"]) == 6 and len(r["fleet"]["outliers"]) == 2)
    fleet = report["fleet"]
    ports = {cluster: [s.server_address[1] for s in servers] for cluster, servers in clusters.exporters.items()}
    assert {h["host"] for h in fleet["hosts"]} == {f"{c}/127.0.0.1:{p}" for c, ps in ports.items() for p in ps}
    assert {h["cluster"] for h in fleet["hosts"]} == {"east", "west"}
    assert fleet["hosts_down"] == []
    # Each cluster's slow worker, though west's healthy hosts are slower than east's slow one.
    outliers = sorted((o["host"], o["figure"]) for o in fleet["outliers"])
    assert outliers == [(f"east/127.0.0.1:{ports['east'][2]}", "utilization_percent"),
                        (f"west/127.0.0.1:{ports['west'][0]}", "utilization_percent")]
    assert [(c["cluster"], c["hosts"], c["median_utilization_percent"]) for c in fleet["clusters"]] == [
        ("east", 3, 88.0), ("west", 3, 60.0)]
    assert fleet["silent_clusters"] == []
    assert fleet["error"] is None
    assert {d["key"].split("/")[0] for d in report["devices"]["devices"]} == {"east", "west"}


@needs_prometheus
def test_dashboard_queries_filter_by_cluster(clusters):
    boards = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
    queried, answered = 0, 0
    for path in sorted(boards.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets") or []:
                expr = target["expr"]
                if "$cluster" not in expr:
                    continue
                expr = expr.replace("$cluster", "west").replace("$instance", ".*").replace("$__rate_interval", "30s")
                found = clusters.central.query(expr)
                assert all(s["metric"].get("cluster", "west") == "west" for s in found), (panel["title"], found)
                queried += 1
                answered += bool(found)
    assert queried >= 20, (queried, answered)
    assert answered >= 12, (queried, answered)
    distance = clusters.central.query(
        'instance:tpu_tools_device_utilization_ratio:distance_from_cluster_median{cluster="east"}')
    assert sorted(round(100 * float(s["value"][1])) for s in distance) == [-48, 0, 2]  # ratios, in points


@needs_prometheus
def test_a_silent_cluster_is_named_then_a_lost_store_is_one_line(own_clusters):
    clusters = own_clusters
    source = FleetSource(clusters.central.url, timeout_s=3, silent_after_s=3)
    until(source.build, lambda r: len(r["fleet"]["hosts"]) == 6)
    west = clusters.agents["west"]
    assert west.process is not None
    west.process.send_signal(signal.SIGKILL)  # the cluster stops writing, as a lost link or a crash would
    west.process.wait(timeout=10)
    # West alone (east, writing every second, may lag past 3 s for a moment on a loaded machine).
    report = until(source.build, lambda r: [s["cluster"] for s in r["fleet"]["silent_clusters"]] == ["west"],
                   timeout=60)
    assert report["fleet"]["silent_clusters"][0]["last_sample_age_s"] >= 3  # rounded to 0.1 s
    frame = "\n".join(line.text for line in render(as_report(report), ViewState(), 200, None, interactive=False))
    assert "cluster west silent for" in frame  # tpu-top's Hosts title
    clusters.central.stop()  # the store goes away: the last figures stay, marked stale, with one line why
    stale = report_document(source.build())
    assert stale["fleet"]["stale"] is True
    assert len(stale["fleet"]["hosts"]) == 6
    assert "\n" not in stale["fleet"]["error"]
    assert "Prometheus at" in stale["fleet"]["error"]
