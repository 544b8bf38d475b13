#!/usr/bin/env python3
"""The fleet view and the dashboards at 250 to 2,000 hosts x 8 chips, against a real Prometheus.

A simulation in place of thousands of live exporters: one synthetic target serves the series of N hosts
(each the exporter's real ReportCollector rendering a synthetic report of one host: 8 TPU chips, one agent
job; host 17 is the slow worker), every series with its own `instance` label, scraped with `honor_labels`
every --interval seconds by a real Prometheus (Debian's) that also evaluates deploy/prometheus/records.yml.
Once Prometheus holds every chip and --settle seconds of samples, it times:

- one refresh of `tpu-top --from-prometheus` (the queries, the records, the frame) and of the fleet report
  (`tpu-monitor --from-prometheus`: the queries, the records, the JSON line), and the Python memory one
  refresh allocates at its peak (tracemalloc);
- every dashboard panel's query as Grafana sends it with Cluster and Host = All (one host on the Host
  dashboard, which shows one), as a query_range of 240
  steps: Grafana's 1 h panel at 15 s resolution evaluates each query at 240 points, each on the newest
  sample; here the 240 points span the last --settle seconds, where every point has samples (the
  simulation has no hour of history), so the evaluation work per point is that of a full hour.

Targets at 1,000 x 8: each under 1 s.

    python benchmarks/fleet_scale.py [--hosts 250,500,1000,2000] [--interval 10] [--settle 60]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from fleet_view import host_report  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402
from promstack import PROMETHEUS, PrometheusServer, http_get  # noqa: E402

from tpu_tools import jsonout  # noqa: E402
from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector, with_labels  # noqa: E402
from tpu_tools.exporter.webserver import serve_metrics  # noqa: E402
from tpu_tools.metrics.fleet.records import build_groups  # noqa: E402
from tpu_tools.metrics.fleet.source import SERIES_QUERY, FleetSource  # noqa: E402
from tpu_tools.top.frame import render  # noqa: E402
from tpu_tools.top.model import ViewState  # noqa: E402

RECORDS = REPO / "deploy" / "prometheus" / "records.yml"


class ManyHosts:
    """The series of `hosts` exporters as one target: each host's families with its `instance` label."""

    def __init__(self, hosts: int, chips: int):
        merged: dict[str, Metric] = {}
        for index in range(hosts):
            collector = ReportCollector(dict(BUILTIN))
            collector.update(host_report(index, chips))
            labels = {"instance": f"host-{index:05d}"}
            for family in collector.collect():
                family = with_labels(family, labels)
                first = merged.setdefault(family.name, family)
                if first is not family:
                    first.samples.extend(family.samples)
        self.families = list(merged.values())
        self.series = sum(len(f.samples) for f in self.families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families

    def generation(self) -> int:
        return 0  # the same series every scrape: rendered once


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted((REPO / "deploy" / "grafana").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                found.append((f"{path.stem.removeprefix('tpu-tools-')}: {panel['title']}", target["expr"]))
    return found


def time_panels(url: str, range_s: float) -> list[tuple[float, str, int]]:
    timed = []
    for title, expr in dashboard_queries():
        # The Host dashboard shows one host; the others all of them.
        host = "host-00017" if title.startswith("host:") else ".*"
        expr = expr.replace("$instance", host).replace("$__rate_interval", "1m").replace("$cluster", ".*")
        end = time.time()
        params = {"query": expr, "start": f"{end - range_s:.3f}", "end": f"{end:.3f}", "step": f"{range_s / 240:.3f}"}
        started = time.perf_counter()
        body = http_get(f"{url}/api/v1/query_range?" + urllib.parse.urlencode(params), timeout=60)
        elapsed = time.perf_counter() - started
        document = json.loads(body)
        assert document["status"] == "success", document
        timed.append((elapsed, title, len(document["data"]["result"])))
    return timed


def measure(hosts: int, chips: int, interval: float, settle: float, refreshes: int, range_s: float) -> dict:
    target = ManyHosts(hosts, chips)
    server = serve_metrics(target, "127.0.0.1", 0)
    port = server.server_address[1]
    workdir = Path(tempfile.mkdtemp(prefix="fleetscale"))
    job = (f"  - job_name: tpu-tools\n    honor_labels: true\n    scrape_interval: {interval:g}s\n"
           f"    scrape_timeout: {interval:g}s\n    static_configs:\n"
           f"      - targets: ['127.0.0.1:{port}']\n        labels: {{instance: host-00000}}\n")
    prometheus = PrometheusServer(workdir, {}, rule_files=[RECORDS], interval=f"{interval:g}s",
                                  extra_config=job)
    prometheus.start()
    try:
        prometheus.wait_for("tpu_tools_device_utilization_ratio", count=hosts * chips, timeout=600)
        time.sleep(settle)  # samples for the range queries and rates
        source = FleetSource(prometheus.url, 30.0)
        state = ViewState()
        top_times, report_times, build_times = [], [], []
        for _ in range(refreshes):
            started = time.perf_counter()
            report = source.build()
            built = time.perf_counter()
            render(report, state, 200, 60)
            top_times.append(time.perf_counter() - started)
            build_times.append(built - started)
            started = time.perf_counter()
            line = jsonout.dumps(source.build(), compact=True)
            report_times.append(time.perf_counter() - started)
        assert report.fleet is not None and report.fleet.error is None, report.fleet
        assert len(report.fleet.hosts) == hosts, len(report.fleet.hosts)
        started = time.perf_counter()  # what reading every series would cost (the path up to 64 hosts)
        build_groups(source.api.query(SERIES_QUERY), source.api.query("up"))
        every_series = time.perf_counter() - started
        tracemalloc.start()
        render(source.build(), state, 200, 60)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        panels = time_panels(prometheus.url, range_s)
        return {"hosts": hosts, "series": target.series, "top_median": statistics.median(top_times),
                "top_max": max(top_times), "build_median": statistics.median(build_times),
                "report_median": statistics.median(report_times), "report_max": max(report_times),
                "report_bytes": len(line), "every_series": every_series, "peak_bytes": peak, "panels": panels,
                "outliers": [o.host for o in report.fleet.outliers]}
    finally:
        prometheus.stop()
        server.shutdown()
        server.server_close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="250,500,1000,2000")
    parser.add_argument("--chips", type=int, default=8)
    parser.add_argument("--interval", type=float, default=10.0, help="scrape and rule interval, seconds")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds of samples before timing")
    parser.add_argument("--refreshes", type=int, default=5)
    args = parser.parse_args()
    args.range_s = args.settle
    if PROMETHEUS is None:
        raise SystemExit("prometheus is not installed (apt-get install prometheus)")
    print(f"# benchmarks/fleet_scale.py --hosts {args.hosts} --chips {args.chips} --interval {args.interval:g} "
          f"--settle {args.settle:g} --refreshes {args.refreshes}")
    print("| hosts x chips | series | tpu-top refresh median / max | fleet report median / max | "
          "report JSON | refresh peak Python memory | slowest panel query | panels over 1 s | reading every series |")
    print("|---|---|---|---|---|---|---|---|---|")
    for hosts in (int(n) for n in args.hosts.split(",")):
        result = measure(hosts, args.chips, args.interval, args.settle, args.refreshes, args.range_s)
        slowest = max(result["panels"])
        over = sum(1 for elapsed, _, _ in result["panels"] if elapsed >= 1.0)
        print(f"| {hosts} x {args.chips} | {result['series']} | {result['top_median'] * 1e3:.0f} / "
              f"{result['top_max'] * 1e3:.0f} ms | {result['report_median'] * 1e3:.0f} / "
              f"{result['report_max'] * 1e3:.0f} ms | {result['report_bytes'] / 1e6:.1f} MB | "
              f"{result['peak_bytes'] / 2**20:.0f} MiB | {slowest[0] * 1e3:.0f} ms ({slowest[1]}) | "
              f"{over} of {len(result['panels'])} | {result['every_series']:.1f} s |", flush=True)
        print(f"<!-- outliers {result['outliers']}; panels: "
              + ", ".join(f"{t * 1e3:.0f}" for t, _, _ in result["panels"]) + " ms -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
