"""The `processes` group: one entry per agent-attached process, and device holders without an agent.

Agents are asked in parallel, each within the agent timeout; one that fails
gets an entry with its `error` and the others are unaffected. Sockets that
are not ours or not private are listed under `ignored_sockets`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tpu_tools.metrics.agent_client import AgentResult
from tpu_tools.metrics.cacheshare import shared_cache_dirs
from tpu_tools.metrics.global_check import global_metric_findings
from tpu_tools.metrics.goodput import goodput_entry
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceHolders
from tpu_tools.metrics.jobreport import JobLogs
from tpu_tools.metrics.process import ProcessSampler
from tpu_tools.metrics.processfacts import ProcessFacts
from tpu_tools.metrics.records.agent import CompileCounts, Compiles, Device, Metrics, ProcessFigures, Steps, TpuSdk
from tpu_tools.metrics.records.jobs import (
    AgentDevice,
    AgentEntry,
    ChipHealth,
    EntryCompiles,
    EntrySteps,
    Holder,
    IgnoredSocket,
    PodOwner,
    PublishedMetric,
    SdkFigures,
)
from tpu_tools.metrics.records.jobs import ProcessesGroup as Processes
from tpu_tools.metrics.slurm import job_id
from tpu_tools.metrics.stall import StallStacks, stall_findings, stalled_for
from tpu_tools.metrics.tpuhealth import health_from_sdk
from tpu_tools.shorten import shorten


def device_memory_bytes(device: AgentDevice) -> int | None:
    """What a device holds for a process: the platform's figure, else its live arrays."""
    return device.memory_used_bytes if device.memory_used_bytes is not None else device.live_array_bytes


def sdk_figures(sdk: TpuSdk | None) -> SdkFigures | None:
    """The agent's libtpu SDK read (TensorCore utilization per core), checked; None from older agents."""
    if sdk is None:
        return None
    cores = sdk.tensorcore_utilization_percent
    utilization = None
    if cores is not None:  # free-form in the snapshot: each core's figure is checked here
        utilization = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 100
                       else None for v in cores]
    metrics = sdk.metrics or {}
    unreadable = {str(name): shorten(str(entry.get("error")), 200) for name, entry in metrics.items()
                  if isinstance(entry, dict) and entry.get("error") is not None}
    health = health_from_sdk(metrics)
    return SdkFigures(status=shorten(str(sdk.status), 200), tensorcore_utilization_percent=utilization,
                      metrics=sorted(str(name) for name in metrics if str(name) not in unreadable),
                      unreadable=unreadable,
                      health=msgspec.convert(health.to_dict(), ChipHealth) if health is not None else None,
                      read_age_s=sdk.read_age_s)  # how old the agent's latest complete reading is


def _total(devices: list[AgentDevice], figure: str) -> int | None:
    """A figure summed over the devices; unknown where no device knows it (torch_xla counts no live arrays)."""
    known = [value for value in (getattr(d, figure) for d in devices) if value is not None]
    return sum(known) if known else None


def _device(device: Device) -> AgentDevice:
    return AgentDevice(id=device.id, platform=device.platform, device_kind=device.device_kind,
                       memory_used_bytes=device.memory_used_bytes, memory_peak_bytes=device.memory_peak_bytes,
                       memory_limit_bytes=device.memory_limit_bytes, live_array_bytes=device.live_array_bytes,
                       live_array_count=device.live_array_count)


def _compiles(compiles: Compiles | None) -> EntryCompiles:
    if compiles is None:
        return EntryCompiles()
    counts = {name: getattr(compiles, name) for name in CompileCounts.__struct_fields__}
    return EntryCompiles(**counts, in_memory_cache_hits=compiles.in_memory_cache_hits,
                         functions=compiles.functions or [], recent_recompiles=compiles.recent_recompiles or [])


def agent_entry(result: AgentResult, price_per_hour: float | None = None) -> AgentEntry:
    """One entry of the `processes` group from an agent's answer (its figures, or its error), with the monitor's
    price where the job has none; never raises."""
    entry = AgentEntry(pid=result.pid, error=result.error, socket=str(result.socket_path),
                       query_time_s=result.elapsed_s)
    snapshot = result.snapshot
    if snapshot is None:
        return entry
    process = snapshot.process or ProcessFigures()
    runtime = snapshot.runtime
    devices = [_device(d) for d in snapshot.devices or []]
    memory = [m for m in (device_memory_bytes(d) for d in devices) if m is not None]
    metrics = snapshot.metrics or Metrics()
    steps = snapshot.steps or Steps()
    return msgspec.structs.replace(
        entry, tag=snapshot.tag, user=snapshot.user, command=snapshot.command, uptime_s=snapshot.uptime_s,
        jax_version=snapshot.jax_version, frontend=snapshot.frontend, frontend_version=snapshot.frontend_version,
        platform=runtime.platform if runtime else None, cpu_percent=process.cpu_percent,
        cpu_time_s=process.cpu_time_s, rss_bytes=process.rss_bytes, threads=process.threads,
        # unknown, never 0, where no device knows it (torch_xla on the CPU platform)
        device_memory_used_bytes=sum(memory) if memory else None,
        live_array_bytes=_total(devices, "live_array_bytes"), live_array_count=_total(devices, "live_array_count"),
        devices=devices, compiles=_compiles(snapshot.compiles),
        steps=EntrySteps(**msgspec.structs.asdict(steps)), compilation_cache=snapshot.compilation_cache,
        executions=snapshot.executions, transfers=snapshot.transfers, cpu_fallbacks=snapshot.cpu_fallbacks,
        startup=snapshot.startup, tpu_sdk=sdk_figures(snapshot.tpu_sdk),
        goodput=goodput_entry(snapshot.goodput, price_per_hour),
        process_index=runtime.process_index if runtime else None,
        process_count=runtime.process_count if runtime else None,
        metrics=[PublishedMetric(**msgspec.structs.asdict(m)) for m in metrics.values or []],
        metrics_rejected=metrics.rejected, metrics_error=metrics.last_error, job=snapshot.job)


def _ask_stacks(pid: int, timeout_s: float) -> Any:
    from tpu_tools.metrics.agent_client import query_stacks

    return query_stacks(pid, timeout_s)


class ProcessesGroup:
    name = "processes"
    record_type = Processes
    reads_agents = True  # the report asks the agents at the start of a round in which this group is due

    def __init__(self, options: CollectOptions):
        from tpu_tools.metrics.kube.labels import PodLabeler
        from tpu_tools.metrics.kube.podresources import PodResourcesClient, socket_path
        from tpu_tools.pjrt.discover import sysroot

        self._sampler = ProcessSampler()
        root = sysroot()
        self._pods = PodLabeler(PodResourcesClient(socket_path(), options.agent_timeout_s), root)
        self._slurm_jobs = ProcessFacts(lambda pid: job_id(pid, root))
        self._stalls = StallStacks(lambda pid: _ask_stacks(pid, options.agent_timeout_s))
        self._jobs = JobLogs()  # the jobs across restarts the agents belong to (metrics/jobreport.py)
        self._pod_labels: Any = None
        if options.pod_labels:
            from tpu_tools.metrics.kube.api import PodLabelReader

            self._pod_labels = PodLabelReader(options.agent_timeout_s)

    def collect(self, context: CollectContext) -> Processes:
        scan = context.agents()
        agents = [agent_entry(r, context.options.price_per_hour) for r in scan.results]
        agent_pids = {r.pid for r in scan.results}
        self._mark_stalls(agents)
        holders: dict[int, Holder] = {}
        discovery = context.discovery()
        held = context.chip_holders()
        for chip in discovery.chips:
            for holder in held[chip.index].holders:
                if holder.pid in agent_pids:
                    continue
                entry = holders.setdefault(holder.pid, Holder(pid=holder.pid, user=holder.user,
                                                              command=holder.command))
                entry.chips.append(chip.index)
        for pid, entry in holders.items():
            figures = self._sampler.sample(pid)
            if figures:
                entry.cpu_percent, entry.cpu_time_s = figures.cpu_percent, figures.cpu_time_s
                entry.rss_bytes, entry.threads = figures.rss_bytes, figures.threads
        self._sampler.forget_except(set(holders))
        entries: list[AgentEntry | Holder] = [*agents, *holders.values()]
        pods_error = self._label_pods(entries, discovery, held)
        self._slurm_jobs.forget_except({process.pid for process in entries})
        for process in entries:
            process.slurm_job_id = self._slurm_jobs.get(process.pid)
        if self._pod_labels is not None:
            pods_error = self._read_pod_labels(entries) or pods_error
        return Processes(agents=agents, shared_cache_dirs=shared_cache_dirs(agents),
                         holders=sorted(holders.values(), key=lambda h: h.pid),
                         ignored_sockets=[IgnoredSocket(socket=str(i.path), reason=i.reason) for i in scan.ignored],
                         pod_labels_error=pods_error, global_metric_findings=global_metric_findings(agents),
                         stall_findings=stall_findings(agents),
                         jobs=self._jobs.reports(agents))

    def _mark_stalls(self, agents: list[AgentEntry]) -> None:
        """`stalled_s` on every agent entry, and the `stack` of each stalled one (asked once per step count)."""
        stalled = set()
        for agent in agents:
            agent.stalled_s = stalled_for(agent.steps) if not agent.error else None
            if agent.stalled_s is not None:
                stalled.add(agent.pid)
                agent.stack = self._stalls.stack(agent.pid, agent.steps.count if agent.steps else None)
        self._stalls.forget_except(stalled)

    def _label_pods(self, entries: list[AgentEntry | Holder], discovery: Any,
                    chip_holders: dict[int, DeviceHolders]) -> str | None:
        """Set `kubernetes` {namespace, pod, container} on the entries of processes that run in a pod."""
        from tpu_tools.metrics.kube.labels import HeldChip, chip_aliases

        held: dict[int, list[HeldChip]] = {}
        for chip in discovery.chips:
            holders_of_chip = chip_holders[chip.index].holders
            if not holders_of_chip:
                continue
            named = HeldChip(chip.platform, chip.index, chip_aliases(self._pods.root, chip.platform, chip.pci_address))
            for holder in holders_of_chip:
                held.setdefault(holder.pid, []).append(named)
        found, error = self._pods.labels([e.pid for e in entries], held)
        for entry in entries:
            owner = found.get(entry.pid)
            entry.kubernetes = (PodOwner(namespace=owner.namespace, pod=owner.pod, container=owner.container)
                                if owner else None)
        return error

    def _read_pod_labels(self, entries: list[AgentEntry | Holder]) -> str | None:
        """Add `labels` (the pod's Kubernetes labels, as label names) to each entry's `kubernetes`; the first
        failure, if any."""
        from tpu_tools.errors import RuntimeFailure

        error = None
        for entry in entries:
            pod = entry.kubernetes
            if pod is not None:
                try:
                    pod.labels = self._pod_labels.labels(pod.namespace, pod.pod)
                except RuntimeFailure as failure:
                    error = error or str(failure)
        return error

    def close(self) -> None:
        self._pods.client.close()
