"""Scraped series back into the records of a monitor report, one host per Prometheus `instance`.

The report has the shape of `tpu-tools/monitor/v1` (see `tpu_tools.metrics.report`) so tpu-top and
tpu-monitor show it as they show the local host; device keys are prefixed with the host ("node-3/tpu:0")
and every device and agent carries a `host` field. A `fleet` group (metrics.records.fleet) adds one summary
per host.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tpu_tools.metrics.cacheshare import shared_cache_dirs, take_fleet_sample
from tpu_tools.metrics.fleet.client import Sample
from tpu_tools.metrics.fleet.jobs import fleet_jobs
from tpu_tools.metrics.fleet.outliers import digest_outliers, furthest, median_of
from tpu_tools.metrics.global_check import global_metric_findings
from tpu_tools.metrics.records.fleet import ClusterSummary, FleetGroup, FleetHost
from tpu_tools.metrics.records.jobs import AgentEntry, JobLife, ProcessesGroup
from tpu_tools.metrics.records.libtpu import LibtpuGroup, LibtpuService
from tpu_tools.metrics.stall import stall_findings
from tpu_tools.parsing import ascii_digits

PREFIX = "tpu_tools_"
HOST_LABEL = "instance"  # Kubernetes deployments relabel it to the node name (deploy/kubernetes)
CLUSTER_LABEL = "cluster"  # set by each cluster's Prometheus (external_labels) when many write to one store
# The recording rules of deploy/prometheus/records.yml: one series per host, for fleets too large to read
# every chip's series each refresh.
SUMMARY_RECORDS = {
    "instance:tpu_tools_device_chips:count": "chips",
    "instance:tpu_tools_device_utilization_ratio:avg": "utilization_percent",
    "instance:tpu_tools_device_memory_used_bytes:sum": "memory_used_bytes",
    "instance:tpu_tools_device_memory_total_bytes:sum": "memory_total_bytes",
    "instance:tpu_tools_agents:count": "jobs",
    "instance:tpu_tools_process_steps_per_second:sum": "steps_per_second",
    "instance:tpu_tools_process_step_time_seconds:median": "step_time_s",
    "instance:tpu_tools_process_recompiles:sum": "recompiles",
}
# The records' ratios are the report's percents.
_SUMMARY_SCALES = {"utilization_percent": 100.0}
_INTEGER_SUMMARIES = {"chips", "memory_used_bytes", "memory_total_bytes", "jobs", "recompiles"}

_DEVICE_FIGURES = {"memory_used_bytes", "memory_total_bytes", "live_array_bytes", "utilization_percent"}
_PROCESS_GAUGES = {"cpu_percent": "cpu_percent", "rss_bytes": "rss_bytes", "threads": "threads",
                   "device_memory_used_bytes": "device_memory_used_bytes", "live_array_bytes": "live_array_bytes",
                   "live_arrays": "live_array_count"}
_COMPILE_COUNTERS = {"compiles_total": "compile_count", "recompiles_total": "recompile_count",
                     "persistent_cache_hits_total": "cache_hits", "persistent_cache_misses_total": "cache_misses"}
_HOST_GAUGES = {"host_cpu_percent": "cpu_percent", "host_memory_total_bytes": "memory_total_bytes",
                "host_memory_used_bytes": "memory_used_bytes", "host_memory_available_bytes": "memory_available_bytes",
                "host_swap_used_bytes": "swap_used_bytes"}


def host_key(labels: dict[str, str]) -> str:
    """A host's name in the fleet view: its instance, qualified by its cluster where there is one."""
    instance = labels.get(HOST_LABEL, "?")
    cluster = labels.get(CLUSTER_LABEL)
    return f"{cluster}/{instance}" if cluster else instance


@dataclass
class _Host:
    name: str
    cluster: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)  # figures from the recording rules, when read
    host: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    libtpu: dict[str, bool] = field(default_factory=dict)
    digests: set[tuple[str, str, str]] = field(default_factory=set)  # tpu-diag's (test, key, digest)


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def _device(host: _Host, labels: dict[str, str]) -> dict[str, Any]:
    key = labels.get("device", "?")
    if key not in host.devices:
        host.devices[key] = {
            "key": f"{host.name}/{key}", "host": host.name, "platform": labels.get("platform"),
            "id": _device_id(key), "name": labels.get("name"), "memory_used_bytes": None,
            "memory_total_bytes": None, "live_array_bytes": None, "utilization_percent": None,
            "holders": [], "holder_processes": None, "processes": [], "sources": ["prometheus"], "extra": {},
        }
    return host.devices[key]


def _device_id(key: str) -> int | None:
    tail = key.split(":", 1)[-1].split("@", 1)[0]
    return int(tail) if ascii_digits(tail) else None


def _agent(host: _Host, labels: dict[str, str]) -> dict[str, Any]:
    pid = labels.get("pid", "0")
    if pid not in host.agents:
        host.agents[pid] = {
            "pid": int(pid) if ascii_digits(pid) else 0, "tag": labels.get("tag") or None, "host": host.name,
            "user": None, "command": None, "error": None, "compiles": {}, "steps": {}, "devices": [],
        }
    return host.agents[pid]


def known(sample: Sample) -> bool:
    """A series of the exporter's host, device, process or libtpu groups (others, e.g. GPU series, are left)."""
    name = sample.name[len(PREFIX):]
    return sample.name.startswith(PREFIX) and (name.startswith(("host_", "device_", "process_", "libtpu_", "job_"))
                                               or name in ("agent_up", "diag_digest_info"))


def _take(hosts: dict[str, _Host], sample: Sample) -> None:
    name = sample.name[len(PREFIX):]
    host = _host_of(hosts, sample.labels)
    labels, value = sample.labels, sample.value
    if name in _HOST_GAUGES:
        host.host[_HOST_GAUGES[name]] = _number(value)
    elif name == "host_load_average":
        host.host[f"load_average_{labels.get('window')}"] = value
    elif name == "device_holder_processes":
        _device(host, labels)["holder_processes"] = int(value)
    elif name.startswith("device_"):
        figure = name[len("device_"):]
        target = _device(host, labels)
        if figure.endswith("_ratio"):  # the exporter's ratios are the report's percents
            figure, value = figure.removesuffix("_ratio") + "_percent", round(value * 100, 9)
        if figure in _DEVICE_FIGURES:
            target[figure] = _number(value)
        else:
            target["extra"][figure] = _number(value)
    elif name == "agent_up":
        if value == 0:
            _agent(host, labels)["error"] = "the agent did not answer the exporter"
        else:
            _agent(host, labels)
    elif name.startswith("process_"):
        _take_process(_agent(host, labels), name[len("process_"):], labels, value)
    elif name == "libtpu_up":
        host.libtpu[labels.get("address", "?")] = value == 1
    elif name == "diag_digest_info":
        host.digests.add((labels.get("test", "?"), labels.get("key", "?"), labels.get("digest", "?")))


def _host_of(hosts: dict[str, _Host], labels: dict[str, str]) -> _Host:
    key = host_key(labels)
    if key not in hosts:
        hosts[key] = _Host(key, labels.get(CLUSTER_LABEL) or None)
    return hosts[key]


def _take_summary(hosts: dict[str, _Host], sample: Sample) -> None:
    figure = SUMMARY_RECORDS.get(sample.name)
    if figure is not None:
        value = sample.value
        if figure in _SUMMARY_SCALES:
            value = round(value * _SUMMARY_SCALES[figure], 9)
        _host_of(hosts, sample.labels).summary[figure] = int(value) if figure in _INTEGER_SUMMARIES else value


def _take_process(agent: dict[str, Any], figure: str, labels: dict[str, str], value: float) -> None:
    if figure in _PROCESS_GAUGES:
        agent[_PROCESS_GAUGES[figure]] = _number(value)
    elif figure in _COMPILE_COUNTERS:
        agent["compiles"][_COMPILE_COUNTERS[figure]] = int(value)
    elif figure == "compile_seconds_total":
        agent["compiles"][f"{labels.get('phase')}_time_s"] = value
    elif figure == "steps_total":
        agent["steps"]["count"] = int(value)
    elif figure == "steps_per_second":
        agent["steps"]["steps_per_second"] = value
    elif figure == "step_time_seconds":
        agent["steps"][f"{labels.get('stat')}_step_time_s"] = value
    elif figure == "stalled_seconds":
        agent["stalled_s"] = value
    elif figure == "job_info":
        agent["job"] = {"id": labels.get("job_id") or None}
    elif figure == "stack_info":
        agent["stack"] = {"where": labels.get("where") or None, "in_library": labels.get("in_library") == "1"}
    elif figure in _GOODPUT_FIGURES or figure.startswith("metric"):
        _take_goodput(agent, figure, labels, value)
    elif take_fleet_sample(agent, figure, labels, value):
        pass
    elif figure == "device_memory_used_bytes_per_device":
        platform, _, device_id = labels.get("device", ":").partition(":")
        agent["devices"].append({"id": int(device_id) if ascii_digits(device_id) else None, "platform": platform,
                                 "memory_used_bytes": _number(value)})


_GOODPUT_FIGURES = {"goodput_ratio": ("goodput_percent", 100.0), "mfu_ratio": ("mfu_percent", 100.0),
                    "samples_per_second": ("samples_per_s", 1.0), "model_flops_per_second": ("flops_per_s", 1.0),
                    "cost_per_million_samples": ("cost_per_million_samples", 1.0), "goodput_seconds_total": ("", 1.0)}


def _take_goodput(agent: dict[str, Any], figure: str, labels: dict[str, str], value: float) -> None:
    """The goodput series and the job's published metrics (tpu_tools.exporter.goodput) of one agent."""
    if figure in ("metric", "metric_step"):
        name, scope = labels.get("name", "?"), labels.get("scope") or None
        metrics = agent.setdefault("metrics", [])
        entry = next((m for m in metrics if m["name"] == name), None)
        if entry is None:
            entry = {"name": name, "value": None, "step": None, "scope": scope, "kind": labels.get("kind")}
            metrics.append(entry)
        if figure == "metric":
            entry["value"], entry["kind"] = value, labels.get("kind")
        else:
            entry["step"] = int(value)
        return
    goodput = agent.setdefault("goodput", {"since_start": {"causes_s": {}}, "recent": {"causes_s": {}}})
    if figure == "goodput_seconds_total":
        goodput["since_start"]["causes_s"][labels.get("cause", "?")] = value
        return
    window = labels.get("window")
    if window in ("since_start", "recent"):
        key, scale = _GOODPUT_FIGURES[figure]
        goodput[window][key] = value * scale


def _summary(host: _Host, up: bool) -> FleetHost:
    if host.summary or not (host.devices or host.agents):  # read from the recording rules (or nothing known)
        figures = {"chips": 0, "jobs": 0, **host.summary}
        return FleetHost(host=host.name, up=up, cluster=host.cluster, **figures)
    devices = list(host.devices.values())
    utilizations = [d["utilization_percent"] for d in devices if d["utilization_percent"] is not None]
    used = [d["memory_used_bytes"] for d in devices if d["memory_used_bytes"] is not None]
    total = [d["memory_total_bytes"] for d in devices if d["memory_total_bytes"] is not None]
    agents = [a for a in host.agents.values() if not a["error"]]
    rates = [a["steps"]["steps_per_second"] for a in agents if a["steps"].get("steps_per_second") is not None]
    step_times = [a["steps"]["p50_step_time_s"] for a in agents if a["steps"].get("p50_step_time_s") is not None]
    recompiles = [a["compiles"]["recompile_count"] for a in agents if "recompile_count" in a["compiles"]]
    goodputs = [figure for a in agents if (figure := _recent_goodput(a)) is not None]
    return FleetHost(
        host=host.name, up=up, cluster=host.cluster, chips=sum(1 for d in devices if "@" not in d["key"]),
        utilization_percent=statistics.fmean(utilizations) if utilizations else None,
        memory_used_bytes=int(sum(used)) if used else None, memory_total_bytes=int(sum(total)) if total else None,
        jobs=len(host.agents), steps_per_second=sum(rates) if rates else None,
        step_time_s=statistics.median(step_times) if step_times else None,
        recompiles=sum(recompiles) if recompiles else None,
        goodput_percent=statistics.median(goodputs) if goodputs else None)


def _recent_goodput(agent: dict[str, Any]) -> float | None:
    goodput = agent.get("goodput") or {}
    recent = (goodput.get("recent") or {}).get("goodput_percent")
    return recent if recent is not None else (goodput.get("since_start") or {}).get("goodput_percent")


def _host_group(hosts: list[_Host]) -> dict[str, Any]:
    """The fleet's host panel: CPU averaged over hosts, memory and swap summed."""
    group: dict[str, Any] = {"hostname": f"{len(hosts)} hosts", "cpu_count": None, "swap_total_bytes": None}
    cpu = [h.host["cpu_percent"] for h in hosts if "cpu_percent" in h.host]
    group["cpu_percent"] = statistics.fmean(cpu) if cpu else None
    for key in ("memory_total_bytes", "memory_used_bytes", "memory_available_bytes", "swap_used_bytes"):
        values = [h.host[key] for h in hosts if key in h.host]
        group[key] = int(sum(values)) if values else None
    for window in ("1m", "5m", "15m"):
        loads = [h.host[f"load_average_{window}"] for h in hosts if f"load_average_{window}" in h.host]
        group[f"load_average_{window}"] = statistics.fmean(loads) if loads else None
    return group


def build_groups(series: list[Sample], up: list[Sample], summaries: list[Sample] | None = None
                 ) -> dict[str, Any]:
    """The host, devices, processes, libtpu and fleet groups from `tpu_tools_*` series and `up` of their jobs.

    With `summaries` (the recording rules' series of every host), the Hosts figures come from them and
    `series` may hold the chips and jobs of only some hosts."""
    hosts: dict[str, _Host] = {}
    series = [sample for sample in series if known(sample)]
    for sample in series:
        _take(hosts, sample)
    for sample in summaries or []:
        _take_summary(hosts, sample)
    jobs = {s.labels.get("job") for s in [*series, *(summaries or [])]}
    target_up = {host_key(s.labels): s.value == 1 for s in up if s.labels.get("job") in jobs}
    for sample in up:
        if host_key(sample.labels) in target_up:
            _host_of(hosts, sample.labels)
    ordered = [hosts[name] for name in sorted(hosts)]
    for host in ordered:  # the agents holding each device, for the PROCESSES column
        for agent in host.agents.values():
            for device in agent["devices"]:
                key = f"{device['platform']}:{device['id']}"
                if key in host.devices:
                    host.devices[key]["processes"].append({"pid": agent["pid"], "tag": agent["tag"]})
    listed = [_summary(h, target_up.get(h.name, True)) for h in ordered]
    utilization = {s.host: s.utilization_percent for s in listed if s.utilization_percent is not None}
    step_time = {s.host: s.step_time_s for s in listed if s.step_time_s is not None}
    outliers = []
    for cluster in sorted({s.cluster or "" for s in listed}):  # a slice's outliers are within its cluster
        members = {s.host for s in listed if (s.cluster or "") == cluster}
        outliers += [o for o in (furthest({h: v for h, v in utilization.items() if h in members},
                                          "utilization_percent"),
                                 furthest({h: v for h, v in step_time.items() if h in members}, "step_time_s")) if o]
    by_host = {s.host: s for s in listed}
    differing = digest_outliers({h.name: h.digests for h in ordered if h.digests})
    for name, sentence in [(o.host, o.sentence) for o in outliers] + [(o.host, o.sentence) for o in differing]:
        found = by_host[name]
        found.outlier = sentence if found.outlier is None else f"{found.outlier}; {sentence}"
    # the scraped figures as the processes group's entries (lax: a counter scraped as a float is an int)
    agents = [msgspec.convert(a, AgentEntry, strict=False) for h in ordered for a in h.agents.values()]
    findings = global_metric_findings(agents)
    stalls = stall_findings(agents)
    return {
        "host": _host_group(ordered),
        "devices": {"devices": [d for h in ordered for d in h.devices.values()], "chips": [], "notes": []},
        "processes": ProcessesGroup(agents=agents, global_metric_findings=findings, stall_findings=stalls,
                                    shared_cache_dirs=shared_cache_dirs(agents),
                                    jobs=msgspec.convert(fleet_jobs(series, host_key), list[JobLife])),
        "libtpu": LibtpuGroup(services=[LibtpuService(address=f"{h.name}/{address}",
                                                      error=None if ok else "not answering")
                                        for h in ordered for address, ok in sorted(h.libtpu.items())]),
        "fleet": FleetGroup(hosts=listed, hosts_down=sorted(n for n, ok in target_up.items() if not ok),
                            median_utilization_percent=median_of(utilization),
                            median_step_time_s=median_of(step_time), outliers=outliers,
                            global_metric_findings=len(findings), digest_outliers=differing, stall_findings=stalls,
                            clusters=_clusters(listed)),
    }


def _clusters(listed: list[FleetHost]) -> list[ClusterSummary]:
    """Per cluster (where hosts carry one): its hosts, those down and its median duty cycle."""
    found = []
    for cluster in sorted({s.cluster for s in listed if s.cluster}):
        members = [s for s in listed if s.cluster == cluster]
        utilization = {s.host: s.utilization_percent for s in members if s.utilization_percent is not None}
        found.append(ClusterSummary(cluster=cluster, hosts=len(members), hosts_down=sum(1 for s in members if not s.up),
                                    median_utilization_percent=median_of(utilization)))
    return found
