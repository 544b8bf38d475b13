"""Prometheus exposition of monitor reports (`tpu-monitor --prometheus [HOST:]PORT`).

Metrics are built from the latest report on every scrape, so the series of a
process that exited disappear with it. Names start with `tpu_tools_` and carry
their unit (exporter/naming.py); labels: `device` (e.g. tpu:0, or cpu:0@1234 for a process's own
CPU device), `pid`, `tag`, and `namespace`, `pod`, `container` where processes run in
Kubernetes pods. Device and GPU series carry their holder's `tag`, `namespace`, `pod`,
`container` and `slurm_job_id` (exporter/holders.py). A group added later exports its own figures by
giving its collector a `prometheus(data)` method.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tpu_tools.errors import UsageError
from tpu_tools.exporter.buildinfo import build_info_family
from tpu_tools.exporter.goodput import goodput_families
from tpu_tools.exporter.health import health_families
from tpu_tools.exporter.holders import device_holders
from tpu_tools.exporter.jobs import job_families
from tpu_tools.exporter.processlabels import process_label_values, process_labels
from tpu_tools.exporter.selection import MetricSelection
from tpu_tools.metrics.cacheshare import cache_metrics
from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.devices import DevicesRecord
from tpu_tools.metrics.records.host import HostRecord
from tpu_tools.metrics.records.jobs import AgentEntry, EntryCompiles, EntrySteps, ProcessesGroup, StallStack
from tpu_tools.metrics.records.report import GroupRecord, MonitorReport
from tpu_tools.parsing import port_number
from tpu_tools.pjrt.pairing import GPU_PLATFORMS

PREFIX = "tpu_tools_"


def parse_listen_address(text: str) -> tuple[str, int]:
    """"9100" -> ("127.0.0.1", 9100); "0.0.0.0:9100"; "[::1]:9100". Raises UsageError."""
    host, port_text = "127.0.0.1", text.strip()
    if ":" in port_text:
        host, _, port_text = port_text.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
    port = port_number(port_text)
    if port is None:
        raise UsageError(f"--prometheus {text!r}: expected [HOST:]PORT with a port from 1 to 65535")
    return host, port


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=labels)


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    family.add_metric(labels, float(value))


def host_metrics(data: HostRecord) -> Iterator[Metric]:
    """Prometheus families of the `host` group; an unknown figure is left out."""
    simple = [("host_cpu_percent", data.cpu_percent, "Host CPU use, percent of all cores."),
              ("host_memory_total_bytes", data.memory_total_bytes, "Host memory."),
              ("host_memory_used_bytes", data.memory_used_bytes, "Host memory in use (total minus available)."),
              ("host_memory_available_bytes", data.memory_available_bytes, "Host memory available."),
              ("host_swap_used_bytes", data.swap_used_bytes, "Host swap in use.")]
    for name, value, doc in simple:
        family = _gauge(name, doc, [])
        _add(family, [], value)
        yield family
    load = _gauge("host_load_average", "Host load average.", ["window"])
    for window, value in (("1m", data.load_average_1m), ("5m", data.load_average_5m),
                          ("15m", data.load_average_15m)):
        _add(load, [window], value)
    yield load


def device_metrics(data: DevicesRecord) -> Iterator[Metric]:
    """Prometheus families of the `devices` group, labelled by device, platform and name.

    Utilization is a ratio (0..1) on every platform. A source's extra figures are exported here only for
    TPUs, a percent as a ratio: the GPU groups export their own figures under `tpu_tools_gpu_*` (one name
    per figure).
    """
    labels = ["device", "platform", "name"]
    used = _gauge("device_memory_used_bytes", "Device memory in use (the platform's figure, or a source such as "
                  "libtpu or NVML).", labels)
    total = _gauge("device_memory_total_bytes", "Device memory capacity.", labels)
    live = _gauge("device_live_array_bytes", "Bytes of live arrays on the device, from the agents.", labels)
    utilization = _gauge("device_utilization_ratio", "Device utilization from 0 to 1 (TensorCore duty cycle, "
                         "or the share of time a GPU kernel ran), where a source reports it.", labels)
    holders = _gauge("device_holder_processes", "Processes holding the device: on a GPU the processes its driver "
                     "lists (holders_source=\"nvml\" or \"amdsmi\"), else those holding its device node open "
                     "(holders_source=\"device_nodes\"); the toolkit's own observing programs are never counted.",
                     [*labels, "holders_source"])
    extra: dict[str, GaugeMetricFamily] = {}
    for device in data.devices:
        values = [device.key, str(device.platform), str(device.name)]
        _add(used, values, device.memory_used_bytes)
        _add(total, values, device.memory_total_bytes)
        _add(live, values, device.live_array_bytes)
        percent = device.utilization_percent
        _add(utilization, values, None if percent is None else percent / 100)
        _add(holders, [*values, device.holders_source or ""], len(device.holders))
        if device.platform in GPU_PLATFORMS:
            continue
        # The extra record's figures by their names: each is a series of its own (device_<figure>).
        for name, value in msgspec.structs.asdict(device.extra).items():
            if value is None:
                continue
            if name.endswith("_percent") and isinstance(value, (int, float)):
                name, value = name.removesuffix("_percent") + "_ratio", value / 100
            if name not in extra:
                extra[name] = _gauge(f"device_{name}", f"Device figure {name} from an extra source.", labels)
            _add(extra[name], values, value)
    yield from (used, total, live)
    yield utilization
    yield holders
    yield from extra.values()


def _add_frontend_figures(agent: AgentEntry, values: list[str], frontend: GaugeMetricFamily,
                          fallbacks: CounterMetricFamily, executions: CounterMetricFamily,
                          execute_time: CounterMetricFamily, transfer_bytes: CounterMetricFamily,
                          transfer_time: CounterMetricFamily) -> None:
    """The frontend's own figures of one agent: its name and version, and torch_xla's fallbacks, executions and
    transfers (null for a JAX job)."""
    if agent.frontend:
        frontend.add_metric([*values, label_value(agent.frontend), label_value(agent.frontend_version or "")], 1.0)
    for entry in agent.cpu_fallbacks.ops or [] if agent.cpu_fallbacks else []:
        _add(fallbacks, [*values, label_value(entry.op)], entry.count)
    if agent.executions is not None:
        _add(executions, values, agent.executions.count)
        _add(execute_time, values, agent.executions.time_s)
    if agent.transfers is not None:
        for direction, moved in (("to_device", agent.transfers.to_device),
                                 ("from_device", agent.transfers.from_device)):
            if moved is not None:
                _add(transfer_bytes, [*values, direction], moved.bytes)
                _add(transfer_time, [*values, direction], moved.time_s)


def process_metrics(data: ProcessesGroup, command_label: bool = False) -> Iterator[Metric]:
    """Prometheus families of the `processes` group (agents), labelled by pid and tag (and pod, and the command
    where `command_label` asks for it: exporter/processlabels.py)."""
    # Where a process runs in a Kubernetes pod, every process series also names its pod (empty for the others).
    labels = process_labels(data.agents, command_label)
    up = _gauge("agent_up", "1 when the process's agent answered, 0 when asking it failed.", labels)
    gauges = {key: _gauge(f"process_{key}", doc, labels) for key, doc in [
        ("cpu_percent", "Process CPU use, percent of one core."),
        ("rss_bytes", "Process resident memory."),
        ("threads", "Process threads."),
        ("device_memory_used_bytes", "Device memory held by the process (all its devices)."),
        ("live_array_bytes", "Bytes of the process's live arrays."),
        ("live_arrays", "Number of the process's live arrays (per device shard)."),
    ]}
    steps_rate = _gauge("process_steps_per_second", "Steps marked per second (recent window).", labels)
    step_time = _gauge("process_step_time_seconds", "Step time: last, p50 and p99 of recent steps.",
                       [*labels, "stat"])
    counters = {key: _counter(f"process_{name}", doc, labels) for key, name, doc in [
        ("compile_count", "compiles", "Backend compilations (including persistent-cache hits)."),
        ("recompile_count", "recompiles", "Compilations of a function compiled before."),
        ("cache_hits", "persistent_cache_hits", "Persistent compilation cache hits."),
        ("cache_misses", "persistent_cache_misses", "Persistent compilation cache misses."),
    ]}
    compile_time = _counter("process_compile_seconds", "Time spent compiling, by phase.", [*labels, "phase"])
    frontend = _gauge("process_frontend_info", "1 for the frontend that runs the job's programs (jax, torch_xla).",
                      [*labels, "frontend", "version"])
    fallbacks = _counter("process_cpu_fallbacks", "Operations the frontend ran on the CPU instead of the device "
                         "(torch_xla's aten:: fallbacks), by op.", [*labels, "op"])
    executions = _counter("process_executions", "Programs the frontend executed (torch_xla).", labels)
    execute_time = _counter("process_execute_seconds", "Time the frontend's executions took (torch_xla).", labels)
    transfer_bytes = _counter("process_transfer_bytes", "Bytes moved between host and device (torch_xla), by "
                              "direction.", [*labels, "direction"])
    transfer_time = _counter("process_transfer_seconds", "Time of host-device transfers (torch_xla), by direction.",
                             [*labels, "direction"])
    steps = _counter("process_steps", "Steps marked by the job.", labels)
    device_memory = _gauge("process_device_memory_used_bytes_per_device",
                           "Device memory held by the process on one device.", [*labels, "device"])
    stalled = _gauge("process_stalled_seconds", "Seconds since the last step of a job whose steps stopped (more "
                     "than 10 times its median step and 5 s); absent while it steps.", labels)
    stack = _gauge("process_stack_info", "1 for a stalled job: where its main thread is (function, file and "
                   "line of its own code) and whether it is inside a library (in_library 1).",
                   [*labels, "where", "in_library"])
    tensorcore = _gauge("process_tensorcore_utilization_ratio",
                        "TensorCore utilization per core from 0 to 1, read in the job through libtpu's SDK.",
                        [*labels, "core"])
    for agent in data.agents:
        values = process_label_values(agent, labels)
        up.add_metric(values, 0.0 if agent.error else 1.0)
        if agent.error:
            continue
        for key, family in gauges.items():
            _add(family, values, getattr(agent, "live_array_count" if key == "live_arrays" else key))
        compiles = agent.compiles or EntryCompiles()
        for key, counter in counters.items():
            _add(counter, values, getattr(compiles, key))
        for phase, seconds in (("trace", compiles.trace_time_s), ("lowering", compiles.lowering_time_s),
                               ("backend_compile", compiles.backend_compile_time_s)):
            _add(compile_time, [*values, phase], seconds)
        _add_frontend_figures(agent, values, frontend, fallbacks, executions, execute_time, transfer_bytes,
                              transfer_time)
        step_stats = agent.steps or EntrySteps()
        _add(steps, values, step_stats.count)
        _add(steps_rate, values, step_stats.steps_per_second)
        for stat, seconds in (("last", step_stats.last_step_time_s), ("p50", step_stats.p50_step_time_s),
                              ("p99", step_stats.p99_step_time_s)):
            _add(step_time, [*values, stat], seconds)
        _add(stalled, values, agent.stalled_s)
        if agent.stalled_s is not None and isinstance(agent.stack, StallStack) and agent.stack.where:
            stack.add_metric([*values, label_value(agent.stack.where), "1" if agent.stack.in_library is True else "0"],
                             1.0)
        for device in agent.devices:
            used = device.memory_used_bytes if device.memory_used_bytes is not None else device.live_array_bytes
            _add(device_memory, [*values, f"{device.platform}:{device.id}"], used)
        cores = agent.tpu_sdk.tensorcore_utilization_percent if agent.tpu_sdk is not None else None
        for core, value in enumerate(cores or []):
            _add(tensorcore, [*values, str(core)], value / 100 if value is not None else None)
    yield up
    yield from goodput_families(data.agents, labels, lambda agent: process_label_values(agent, labels))
    yield from job_families(data, labels, lambda agent: process_label_values(agent, labels))
    yield from gauges.values()
    yield from counters.values()
    yield compile_time
    yield from (frontend, fallbacks, executions, execute_time, transfer_bytes, transfer_time)
    yield steps
    yield steps_rate
    yield stalled
    yield stack
    yield tensorcore
    yield step_time
    yield device_memory
    yield from health_families(data, labels)
    yield from cache_metrics(data)


BUILTIN: dict[str, Callable[[Any], Iterable[Metric]]] = {
    "host": host_metrics,
    "devices": device_metrics,
    "processes": process_metrics,
}


def slice_labels(report: MonitorReport) -> dict[str, str]:
    """`slice` and `worker` of a TPU slice's host (so a fleet view groups a slice's workers); else none."""
    labels = report.tpu_slice.labels if report.tpu_slice is not None else {}
    return {key: value for key, value in labels.items() if key in ("slice", "worker")}


def with_labels(family: Metric, labels: dict[str, str]) -> Metric:
    """The family with these labels added to every sample (a sample's own label of that name wins)."""
    if labels:
        family.samples = [sample._replace(labels={**labels, **sample.labels}) for sample in family.samples]
    return family


def with_holders(family: Metric, holders: dict[str, dict[str, str]]) -> Metric:
    """A device or GPU family with its holder's labels (exporter/holders.py) on each sample of a held device;
    a per-process sample (with a pid) keeps its own."""
    if holders and family.name.startswith((PREFIX + "device_", PREFIX + "gpu_")):
        family.samples = [sample._replace(labels={**holders[sample.labels["device"]], **sample.labels})
                          if sample.labels.get("device") in holders and "pid" not in sample.labels else sample
                          for sample in family.samples]
    return family


class ReportCollector(Collector):
    """Serves the latest report; `update()` is called by the monitor loop after each round."""

    def __init__(self, exporters: dict[str, Callable[[Any], Iterable[Metric]]],
                 selection: MetricSelection | None = None):
        self._exporters = exporters
        self._selection = selection or MetricSelection()
        self._report: MonitorReport | None = None
        self._lock = threading.Lock()
        self._generation = 0
        self._ready = threading.Event()

    def update(self, report: MonitorReport) -> None:
        with self._lock:
            self._report = report
            self._generation += 1
        self._ready.set()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether a report is there to serve, waiting up to `timeout_s` for the first one: before it, a scrape
        would read no series at all and Prometheus would take the target for up and empty."""
        return self._ready.wait(max(0.0, timeout_s))

    def generation(self) -> int:
        """Changes with every update: the server renders once per report, not once per scrape."""
        return self._generation

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            report = self._report
        if report is None:
            return
        host_labels = slice_labels(report)
        holders = device_holders(report)
        errors = _gauge("group_error", "1 when the group failed in the latest report.", ["group"])
        # Groups may export the same family (nvml and amdsmi: tpu_tools_gpu_*): one family each, samples joined.
        merged: dict[str, Metric] = {}
        for name, export in self._exporters.items():
            data = getattr(report, name)
            if not isinstance(data, GroupRecord):  # a group the report does not carry
                continue
            errors.add_metric([name], 1.0 if data.error else 0.0)
            if not data.error:
                for family in export(data):
                    first = merged.setdefault(family.name, family)
                    if first is not family:
                        first.samples.extend(family.samples)
        for family in [*merged.values(), build_info_family(report), errors]:  # the group errors last, as ever
            # a family without samples is not served (naming.py), nor one the allow and deny lists leave out
            if family.samples and self._selection.selects(family.name):
                yield with_labels(with_holders(family, holders), host_labels)


def exporters_for(collectors: dict[str, Any], command_label: bool = False,
                  ) -> dict[str, Callable[[Any], Iterable[Metric]]]:
    """The built-in exporter of each group, else the collector's own `prometheus` method. `command_label`: the
    process series carry their command (exporter/processlabels.py)."""
    builtin = dict(BUILTIN)
    if command_label:
        builtin["processes"] = functools.partial(process_metrics, command_label=True)
    found: dict[str, Callable[[Any], Iterable[Metric]]] = {}
    for name, collector in collectors.items():
        export = builtin.get(name) or getattr(collector, "prometheus", None)
        if export is not None:
            found[name] = export
    return found


def serve(collector: ReportCollector, host: str, port: int) -> Any:
    """Start the /metrics HTTP server (`webserver`: bounded threads and sockets) in daemon threads;
    RuntimeFailure when the port is taken."""
    from tpu_tools.exporter.webserver import serve_metrics

    return serve_metrics(collector, host, port)
