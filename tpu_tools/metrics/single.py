"""Single-metric queries (`tpu-ls --metric NAME`): one metric, from whichever source serves it, as rows.

Names are tpu-info's (`hbm_usage`, `duty_cycle_percent`, `tensorcore_utilization`, `buffer_transfer_latency`,
`hlo_exec_timing`, `core_state`, ...) or libtpu's own (`tpu.runtime.hbm.memory.usage.bytes`, any served
`megascale.*` distribution); a name starting `jax_orbax_`, `jax_checkpoint_` or `grain_python_` selects the
job's own Orbax / Grain families. Each query yields rows of plain values, so the same result feeds a table
and JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.libtpu import DistributionSummary, LibtpuSnapshot, RuntimeStatus, names
from tpu_tools.metrics.records.jobs import AgentEntry, JobEndpoint, SdkFigures

SCHEMA = "tpu-tools/metric/v1"
PERCENTILE_COLUMNS = ("p50", "p90", "p95", "p999")  # tpu-info's

# tpu-info name -> DeviceFigures fields (one row per device of every answering service).
PER_DEVICE = {
    "hbm_usage": ("hbm_used_bytes", "hbm_total_bytes"),
    "duty_cycle_percent": ("duty_cycle_percent",),
    "runtime_hbm_utilization": ("hbm_bandwidth_utilization_percent",),
    "tensorcore_idle_duration": ("tensorcore_idle_duration_s",),
    "hlo_queue_size": ("hlo_queue_size",),
    "hlo_exec_timing": ("hlo_execution_time_us",),
}
# tpu-info name -> the libtpu distribution behind it (one row per buffer size).
DISTRIBUTIONS = {
    "buffer_transfer_latency": "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution",
    "inbound_buffer_transfer_latency": "megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution",
    "host_to_device_transfer_latency":
        "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution",
    "device_to_host_transfer_latency":
        "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution",
    "collective_e2e_latency": "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution",
    "host_compute_latency": "megascale.mxla_compute_latencies.microsecond.cumulative.distribution",
    "grpc_tcp_min_rtt": "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution",
    "grpc_tcp_delivery_rate": "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution",
}
RUNTIME_STATUS = ("core_state", "sequencer_state", "sequencer_state_detailed", "queued_programs")
AGENT = ("tensorcore_utilization", "ici_link_health", "tpu_throttle_score")  # read by the agents in their jobs
JOB_PREFIXES = ("jax_orbax_", "jax_checkpoint_", "grain_python_")
_LIBTPU_FIELDS = {field: short for short, fields in PER_DEVICE.items() for field in fields}


@dataclass
class MetricResult:
    name: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # sources that did not answer or do not serve it

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "columns": list(self.columns),
                "rows": [dict(zip(self.columns, row, strict=True)) for row in self.rows], "notes": list(self.notes)}


def known_names() -> list[str]:
    return [*PER_DEVICE, *DISTRIBUTIONS, *AGENT, *RUNTIME_STATUS]


def resolve(name: str) -> str:
    """The query a name stands for (a tpu-info name, or libtpu's); ValueError with the known names."""
    for short, field_names in PER_DEVICE.items():
        if name == short or any(names.FIELD_METRICS.get(f) == name for f in field_names):
            return short
    for short, metric in DISTRIBUTIONS.items():
        if name in (short, metric):
            return short
    if name in AGENT or name in RUNTIME_STATUS or name.startswith(JOB_PREFIXES):
        return name
    if names.is_latency_distribution(name) or names.is_rate_distribution(name):
        return name
    raise ValueError(f"unknown metric {name!r}; known: {', '.join(known_names())}, any served megascale.* "
                     f"distribution, or an Orbax / Grain family ({', '.join(p + '*' for p in JOB_PREFIXES)})")


def needs(queries: Sequence[str]) -> set[str]:
    """Which sources the resolved queries read: "libtpu", "status", "agents", "job"."""
    wanted = set()
    for query in queries:
        if query in RUNTIME_STATUS:
            wanted.add("status")
        elif query in AGENT:
            wanted.add("agents")
        elif query.startswith(JOB_PREFIXES):
            wanted.add("job")
        else:
            wanted.add("libtpu")
    return wanted


def _summary_cells(summary: DistributionSummary | None) -> list[Any]:
    if summary is None:
        return [None] * (2 + len(PERCENTILE_COLUMNS))
    return [summary.count, summary.mean, *(summary.percentile(p) for p in PERCENTILE_COLUMNS)]


def _not_answering(snapshots: Sequence[LibtpuSnapshot]) -> list[str]:
    return [f"{s.address}: {s.error}" for s in snapshots if not s.ok]


def per_device(query: str, snapshots: Sequence[LibtpuSnapshot]) -> MetricResult:
    fields = PER_DEVICE[query]
    distribution = fields == ("hlo_execution_time_us",)
    columns = ["service", "device", *(["count", "mean", *PERCENTILE_COLUMNS] if distribution else fields)]
    result = MetricResult(query, columns, notes=_not_answering(snapshots))
    for snapshot in (s for s in snapshots if s.ok):
        if not all(snapshot.serves_field(f) for f in fields):
            result.notes.append(f"{snapshot.address}: not served by this runtime")
            continue
        for device in snapshot.devices:
            values = _summary_cells(device.hlo_execution_time_us) if distribution else \
                [getattr(device, f) for f in fields]
            result.rows.append([snapshot.address, device.device_id, *values])
    return result


def distribution(query: str, snapshots: Sequence[LibtpuSnapshot]) -> MetricResult:
    metric = DISTRIBUTIONS.get(query, query)
    columns = ["service", "label", "count", "mean", *PERCENTILE_COLUMNS]
    result = MetricResult(query, columns, notes=_not_answering(snapshots))
    for snapshot in (s for s in snapshots if s.ok):
        if not snapshot.serves(metric):
            result.notes.append(f"{snapshot.address}: not served by this runtime")
            continue
        entries = [(t.buffer_size, t.latency_us) for t in snapshot.transfer_latencies if t.metric == metric]
        entries += [(r.label, r.rate_mbps) for r in snapshot.delivery_rates if r.metric == metric]
        result.rows += [[snapshot.address, label, *_summary_cells(summary)] for label, summary in entries]
    return result


def runtime_status(query: str, statuses: Sequence[RuntimeStatus]) -> MetricResult:
    if query == "queued_programs":
        columns = ["service", "core", "run_id", "launch_id", "program_fingerprint"]
    elif query == "core_state":
        columns = ["service", "core", "chip", "core_type", "state", "error_message"]
    else:
        columns = ["service", "core", "sequencer", "pc", "program_id", "run_id", "hlo_location",
                   *(["hlo_detailed_info"] if query == "sequencer_state_detailed" else [])]
    result = MetricResult(query, columns)
    for status in statuses:
        if not status.ok:
            result.notes.append(f"{status.address}: {status.error or 'runtime status not served by this runtime'}")
            continue
        for core in status.cores:
            base = [status.address, core.global_core_id]
            if query == "core_state":
                result.rows.append([*base, core.chip_id, core.core_type, core.state, core.error_message])
            elif query == "queued_programs":
                result.rows += [[*base, q.run_id, q.launch_id, q.program_fingerprint] for q in core.queued_programs]
            else:
                for s in core.sequencers:
                    row = [*base, f"{s.sequencer_type}:{s.index}", s.pc, s.program_id, s.run_id, s.hlo_location]
                    result.rows.append([*row, s.hlo_detailed_info] if query == "sequencer_state_detailed" else row)
    return result


def _status(sdk: SdkFigures | None) -> str:
    return (sdk.status if sdk is not None else None) or "no SDK"


def tensorcore_utilization(agents: Sequence[AgentEntry]) -> MetricResult:
    result = MetricResult("tensorcore_utilization", ["pid", "tag", "core", "utilization_percent"])
    for agent in agents:
        cores = agent.tpu_sdk.tensorcore_utilization_percent if agent.tpu_sdk is not None else None
        if agent.error or cores is None:
            result.notes.append(f"pid {agent.pid}: {agent.error or _status(agent.tpu_sdk)}")
            continue
        result.rows += [[agent.pid, agent.tag, core, value] for core, value in enumerate(cores)]
    if not agents:
        result.notes.append("no agent answered (TensorCore utilization is read inside the job by its agent)")
    return result


def _health_rows(agents: Sequence[AgentEntry], name: str, key: str, result: MetricResult) -> None:
    """Rows of one health list of every agent that read it; problems and agents without it become notes."""
    for agent in agents:
        sdk = agent.tpu_sdk
        health = sdk.health if sdk is not None else None
        who = f"pid {agent.pid}"
        if agent.error or health is None:
            result.notes.append(f"{who}: {agent.error or _status(sdk)}"
                                + ("" if agent.error or sdk is None else f"; {name} not read"))
            continue
        for item in getattr(health, key):
            result.rows.append([agent.pid, agent.tag, *(getattr(item, c) for c in result.columns[2:])])
        result.notes += [f"{who}: {problem}" for problem in health.problems if problem.startswith(name)]
    if not agents:
        result.notes.append(f"no agent answered ({name} is read inside the job by its agent)")


def link_health(agents: Sequence[AgentEntry]) -> MetricResult:
    """libtpu's ICI link health per link (0 healthy .. 10 unusable) of every job whose agent read it."""
    result = MetricResult("ici_link_health", ["pid", "tag", "location", "tray", "chip", "port", "score", "state"])
    _health_rows(agents, "ici_link_health", "ici_links", result)
    return result


def throttle_scores(agents: Sequence[AgentEntry]) -> MetricResult:
    """libtpu's throttle score per device (0 .. 10 = throttled by 0-100 %) of every job whose agent read it."""
    result = MetricResult("tpu_throttle_score", ["pid", "tag", "device", "score", "throttled_percent"])
    _health_rows(agents, "tpu_throttle_score", "throttle", result)
    return result


def job_family(query: str, endpoints: Sequence[JobEndpoint]) -> MetricResult:
    result = MetricResult(query, ["endpoint", "sample", "labels", "value"])
    for endpoint in endpoints:
        if endpoint.error:
            result.notes.append(endpoint.error)
            continue
        for family in endpoint.families:
            if family.name.startswith(query):
                result.rows += [[endpoint.address, s.name, s.labels, s.value] for s in family.samples]
    return result


def answer(query: str, *, snapshots: Sequence[LibtpuSnapshot] = (), statuses: Sequence[RuntimeStatus] = (),
           agents: Sequence[AgentEntry] = (), endpoints: Sequence[JobEndpoint] = ()) -> MetricResult:
    if query in PER_DEVICE:
        return per_device(query, snapshots)
    if query in RUNTIME_STATUS:
        return runtime_status(query, statuses)
    if query == "ici_link_health":
        return link_health(agents)
    if query == "tpu_throttle_score":
        return throttle_scores(agents)
    if query in AGENT:
        return tensorcore_utilization(agents)
    if query.startswith(JOB_PREFIXES):
        return job_family(query, endpoints)
    return distribution(query, snapshots)
