#!/usr/bin/env python3
"""How long one refresh of the fleet view takes for 64 hosts x 4 chips against a local Prometheus.

64 exporters on loopback, each the real ReportCollector serving a synthetic report of one host (4 TPU
chips with their duty cycle and HBM, one agent job with steps and compiles; one host is the slow
worker), scraped every second by a real Prometheus (Debian's package). Then times what
`tpu-top --from-prometheus URL` does every refresh: the queries, the records and the frame.
Target: under 1 s.

    python benchmarks/fleet_view.py [--hosts 64] [--chips 4] [--refreshes 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness import monitor_report  # noqa: E402
from prometheus_client import start_http_server  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402
from promstack import PROMETHEUS, PrometheusServer, free_port  # noqa: E402

from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector  # noqa: E402
from tpu_tools.metrics.fleet.source import FleetSource  # noqa: E402
from tpu_tools.metrics.records.report import MonitorReport  # noqa: E402
from tpu_tools.top.frame import render  # noqa: E402
from tpu_tools.top.model import ViewState  # noqa: E402

GIB = 1 << 30


def host_document(index: int, chips: int) -> dict[str, Any]:
    """One host's report as its JSON document (tpu-monitor's shape)."""
    duty = 40.0 if index == 17 else 85.0 + (index % 5)  # host 17 is the slow worker
    devices = [{"key": f"tpu:{c}", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": 11 * GIB + c,
                "memory_total_bytes": 16 * GIB, "live_array_bytes": 10 * GIB, "utilization_percent": duty,
                "holders": [{"pid": 1000 + index}]} for c in range(chips)]
    agent = {"pid": 1000 + index, "tag": "train", "error": None, "cpu_percent": 99.0, "rss_bytes": 8 * GIB,
             "threads": 40, "device_memory_used_bytes": chips * 11 * GIB, "live_array_bytes": chips * 10 * GIB,
             "live_array_count": 500, "compiles": {"compile_count": 12, "recompile_count": 1, "cache_hits": 3,
                                                   "cache_misses": 9, "trace_time_s": 1.0},
             "steps": {"count": 5000, "steps_per_second": 2.0 * duty / 85, "p50_step_time_s": 0.5 * 85 / duty,
                       "last_step_time_s": 0.5, "p99_step_time_s": 0.7},
             "devices": [{"id": c, "platform": "tpu", "memory_used_bytes": 11 * GIB} for c in range(chips)]}
    return {"hostname": f"host-{index}",
            "host": {"error": None, "cpu_percent": 30.0, "memory_total_bytes": 400 * GIB,
                     "memory_used_bytes": 100 * GIB, "load_average_1m": 8.0},
            "devices": {"error": None, "devices": devices}, "processes": {"error": None, "agents": [agent]}}


def host_report(index: int, chips: int) -> MonitorReport:
    return monitor_report(host_document(index, chips))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--chips", type=int, default=4)
    parser.add_argument("--refreshes", type=int, default=20)
    args = parser.parse_args()
    if PROMETHEUS is None:
        raise SystemExit("prometheus is not installed (apt-get install prometheus)")
    servers, targets = [], []
    for index in range(args.hosts):
        collector = ReportCollector(dict(BUILTIN))
        collector.update(host_report(index, args.chips))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        port = free_port()
        servers.append(start_http_server(port, addr="127.0.0.1", registry=registry)[0])
        targets.append(f"127.0.0.1:{port}")
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench"))
    prometheus = PrometheusServer(workdir, {"tpu-tools": targets}, interval="1s").start()
    try:
        prometheus.wait_for("tpu_tools_device_utilization_ratio", count=args.hosts * args.chips, timeout=120)
        source = FleetSource(prometheus.url, 5.0)
        state = ViewState()
        times = []
        for _ in range(args.refreshes):
            started = time.perf_counter()
            report = source.build()
            render(report, state, 200, 60)
            times.append(time.perf_counter() - started)
        assert report.fleet is not None and report.fleet.error is None and len(report.fleet.hosts) == args.hosts
        outliers = [o.host for o in report.fleet.outliers]
        chips = len(report.devices.devices) if report.devices else 0
        print(f"# benchmarks/fleet_view.py --hosts {args.hosts} --chips {args.chips} --refreshes {args.refreshes}"
              f"  (Prometheus {prometheus.url}, {chips} chips, outliers {outliers})")
        print(f"fleet view refresh (queries + records + frame): median {statistics.median(times) * 1e3:.0f} ms, "
              f"max {max(times) * 1e3:.0f} ms (target < 1000 ms)")
    finally:
        prometheus.stop()
        for server in servers:
            server.shutdown()
            server.server_close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
