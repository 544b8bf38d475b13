#!/usr/bin/env python3
"""Generate the Grafana dashboards in deploy/grafana/ from code (grafana-foundation-sdk).

    python tools/gen_dashboards.py            # write the files
    python tools/gen_dashboards.py --check    # exit 1 and name the files that are stale

Three dashboards read the series of `tpu-monitor --prometheus` (and of the GPU group): the fleet
(every host and chip: duty cycle / utilization, HBM, power, the host furthest from the median), the
jobs (step time, steps/s, compiles and recompiles, live memory, and each job's goodput, lost progress and
recovery across its restarts) and one host. Every query filters on
the `instance` variable; the test suite runs each one against a real Prometheus scraping real
exporters and requires data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "deploy" / "grafana"
sys.path.insert(0, str(REPO / "tools"))

import generated  # noqa: E402

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
HOSTS = '{cluster=~"$cluster",instance=~"$instance"}'  # every query's host filter (no cluster label: matches)
Panel = Callable[[], object]


def _query(expr: str, legend: str = "__auto") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12, height: int = 8,
            description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).span(width).height(height)
    if description:
        panel = panel.description(description)
    for index, query in enumerate(queries):
        panel = panel.with_target(query.ref_id("ABCDEFGH"[index]))
    return panel


def _stat(title: str, unit: str, query: prometheus.Dataquery, width: int = 6) -> stat.Panel:
    return (stat.Panel().title(title).unit(unit).datasource(DATASOURCE).span(width).height(4)
            .graph_mode(BigValueGraphMode.NONE).with_target(query.ref_id("A")))


def _base(uid: str, title: str, multi_host: bool) -> dashboard.Dashboard:
    # Many clusters writing to one store label each series with its cluster (docs/fleet.md); one cluster has none.
    clusters = (dashboard.QueryVariable("cluster").label("Cluster").datasource(DATASOURCE)
                .query("label_values(tpu_tools_host_cpu_percent, cluster)")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*"))
    hosts = (dashboard.QueryVariable("instance").label("Host").datasource(DATASOURCE)
             .query('label_values(tpu_tools_host_cpu_percent{cluster=~"$cluster"}, instance)')
             .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(multi_host).include_all(multi_host))
    if multi_host:
        hosts = hosts.all_value(".*")
    return (dashboard.Dashboard(title).uid(uid).tags(["tpu-tools"]).refresh("30s").time("now-1h", "now")
            .timezone("browser").editable()
            .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
            .with_variable(clusters).with_variable(hosts))


def fleet() -> dashboard.Dashboard:
    # Utilization is a ratio (0 to 1) on every platform, GPUs included: one series name for every chip.
    util = f"tpu_tools_device_utilization_ratio{HOSTS}"
    host_util = f"instance:tpu_tools_device_utilization_ratio:avg{HOSTS}"  # records.yml: one series per host
    return (_base("tpu-tools-fleet", "tpu-tools / Fleet", True)
            .with_row(dashboard.Row("Fleet"))
            .with_panel(_stat("Exporters up", "none", _query('count(up{job=~".*tpu-tools.*"} == 1)')))
            .with_panel(_stat("Accelerators", "none",
                              _query(f"sum(instance:tpu_tools_device_chips:count{HOSTS})")))
            .with_panel(_stat("Mean duty cycle / utilization", "percentunit", _query(f"avg({host_util})")))
            .with_panel(_stat("Device memory in use", "percentunit",
                              _query(f"sum(instance:tpu_tools_device_memory_used_bytes:sum{HOSTS}) / "
                                     f"sum(instance:tpu_tools_device_memory_total_bytes:sum{HOSTS})")))
            # A fleet has thousands of chips: the chip panels show their spread and the chips that stand out
            # (a line per chip is unreadable there, and its query the heaviest of all).
            .with_row(dashboard.Row("Chips"))
            .with_panel(_series("Duty cycle / utilization across hosts", "percentunit",
                                _query(f"quantile(0.5, {host_util})", "median host"),
                                _query(f"quantile(0.1, {host_util})", "10th percentile host"),
                                _query(f"min({util})", "least busy chip"),
                                description="TPU TensorCore duty cycle (libtpu) or the device's utilization "
                                            "(a GPU's share of time a kernel ran)."))
            .with_panel(_series("Least busy chips", "percentunit",
                                _query(f"bottomk(16, {util})", "{{instance}} {{device}}")))
            .with_panel(_series("Fullest chips (memory used / total)", "percentunit",
                                _query(f"topk(16, device:tpu_tools_device_memory:used_ratio{HOSTS})",
                                       "{{instance}} {{device}}")))
            .with_panel(_series("Power", "watt",
                                _query(f"tpu_tools_gpu_power_draw_watts{HOSTS}", "{{instance}} gpu {{gpu}}")))
            .with_panel(bargauge.Panel().title("Distance from the slice's median duty cycle (the slow worker)")
                        .description("Each host's mean duty cycle minus the median over its cluster's hosts "
                                     "(deploy/prometheus/records.yml), the 20 furthest below: the first is the "
                                     "slice's slow worker.")
                        .unit("percentunit").datasource(DATASOURCE).span(12).height(8)
                        .with_target(_query("bottomk(20, instance:tpu_tools_device_utilization_ratio:"
                                            f"distance_from_cluster_median{HOSTS})", "{{cluster}} {{instance}}")
                                     .ref_id("A"))))


def jobs() -> dashboard.Dashboard:
    return (_base("tpu-tools-jobs", "tpu-tools / Jobs", True)
            .with_panel(_series("Step time (p50)", "s",
                                _query('tpu_tools_process_step_time_seconds{cluster=~"$cluster",instance=~"$instance",stat="p50"}',
                                       "{{instance}} {{tag}} {{pid}}")))
            .with_panel(_series("Steps per second", "none",
                                _query(f"tpu_tools_process_steps_per_second{HOSTS}", "{{instance}} {{tag}} {{pid}}")))
            .with_panel(_series("Compiles and recompiles per minute", "none",
                                _query(f"60 * rate(tpu_tools_process_compiles_total{HOSTS}[$__rate_interval])",
                                       "compiles {{instance}} {{tag}}"),
                                _query(f"60 * rate(tpu_tools_process_recompiles_total{HOSTS}[$__rate_interval])",
                                       "recompiles {{instance}} {{tag}}")))
            .with_panel(_series("Live arrays on the devices", "bytes",
                                _query(f"tpu_tools_process_live_array_bytes{HOSTS}", "{{instance}} {{tag}} {{pid}}")))
            .with_panel(_series("Compile time per minute, by phase", "s",
                                _query("60 * topk(16, instance_tag_phase:tpu_tools_process_compile_seconds:rate1m"
                                       f"{HOSTS})", "{{instance}} {{tag}} {{phase}}"),
                                description="The 16 largest (deploy/prometheus/records.yml)."))
            .with_panel(_series("Compilation cache per minute: hits, misses, entries written", "none",
                                _query(f"60 * rate(tpu_tools_process_compilation_cache_hits_total{HOSTS}"
                                       "[$__rate_interval])", "hits {{instance}} {{tag}} {{cache_dir}}"),
                                _query(f"60 * rate(tpu_tools_process_compilation_cache_misses_total{HOSTS}"
                                       "[$__rate_interval])", "misses {{instance}} {{tag}} {{cache_dir}}"),
                                _query(f"60 * rate(tpu_tools_process_compilation_cache_entries_written_total{HOSTS}"
                                       "[$__rate_interval])", "written {{instance}} {{tag}} {{cache_dir}}")))
            .with_panel(_series("Agents answering", "none",
                                _query(f"tpu_tools_agent_up{HOSTS}", "{{instance}} {{tag}} {{pid}}")))
            .with_panel(_series("Goodput over the last minute", "percentunit",
                                _query('tpu_tools_process_goodput_ratio{cluster=~"$cluster",instance=~"$instance",window="recent"}',
                                       "{{instance}} {{tag}} {{pid}}")))
            .with_panel(_series("Where the time goes (seconds per second, by cause)", "s",
                                _query(f"sum by (tag, cause) "
                                       f"(rate(tpu_tools_process_goodput_seconds_total{HOSTS}[$__rate_interval]))",
                                       "{{tag}} {{cause}}")))
            # A job across restarts, from its log (docs/goodput.md): every host that reads a shared log serves
            # the same figures, so each panel takes the largest per job.
            .with_row(dashboard.Row("Jobs across restarts"))
            .with_panel(_series("Job goodput over its whole life", "percentunit",
                                _query(f"max by (job_id) (tpu_tools_job_goodput_ratio{HOSTS})", "{{job_id}}"),
                                width=6, description="Productive share of the job's life across its restarts and "
                                                     "hosts, less the progress its restarts lost."))
            .with_panel(_series("Lost progress", "s",
                                _query(f"max by (job_id) (tpu_tools_job_lost_progress_seconds{HOSTS})",
                                       "{{job_id}}"),
                                width=6, description="Time spent on steps after the checkpoint the next process "
                                                     "resumed from, which it repeated; summed over the job's life."))
            .with_panel(_series("Recovery time", "s",
                                _query(f"max by (job_id) (tpu_tools_job_recovery_seconds{HOSTS})", "{{job_id}}"),
                                width=6, description="From each death of a process of the job to the first step "
                                                     "of its successors, summed over the job's life."))
            .with_panel(_series("Disruptions", "none",
                                _query(f"max by (job_id) (tpu_tools_job_disruptions{HOSTS})", "{{job_id}}"),
                                width=6, description="Processes of the job that died, on the host with the most.")))


def host() -> dashboard.Dashboard:
    return (_base("tpu-tools-host", "tpu-tools / Host", False)
            .with_panel(_series("CPU", "percent", _query(f"tpu_tools_host_cpu_percent{HOSTS}", "{{instance}}")))
            .with_panel(_series("Memory", "bytes",
                                _query(f"tpu_tools_host_memory_used_bytes{HOSTS}", "used"),
                                _query(f"tpu_tools_host_memory_total_bytes{HOSTS}", "total")))
            .with_panel(_series("Load average", "none",
                                _query(f"tpu_tools_host_load_average{HOSTS}", "{{window}}")))
            .with_panel(_series("Device memory per chip", "bytes",
                                _query(f"tpu_tools_device_memory_used_bytes{HOSTS}", "{{device}}")))
            .with_panel(_series("Process resident memory", "bytes",
                                _query(f"tpu_tools_process_rss_bytes{HOSTS}", "{{tag}} {{pid}}")))
            .with_panel(_series("libtpu metrics services answering", "none",
                                _query(f"tpu_tools_libtpu_up{HOSTS}", "{{address}}")))
            .with_panel(_series("GPU temperature", "celsius",
                                _query(f"tpu_tools_gpu_temperature_celsius{HOSTS}", "gpu {{gpu}}"))))


DASHBOARDS = {"tpu-tools-fleet.json": fleet, "tpu-tools-jobs.json": jobs, "tpu-tools-host.json": host}


def render(build: Callable[[], dashboard.Dashboard]) -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def generated_files() -> dict[Path, str | bytes]:
    return {OUT / name: render(build) for name, build in DASHBOARDS.items()}


def stale_files() -> list[Path]:
    return generated.stale(generated_files(), (OUT,))


def main() -> int:
    return generated.main(__doc__.splitlines()[0], generated_files, (OUT,))


if __name__ == "__main__":
    sys.exit(main())
