"""The `processes` group: one entry per agent-attached process, and device holders without an agent.

Agents are asked in parallel, each within the agent timeout; one that fails
gets an entry with its `error` and the others are unaffected. Sockets that
are not ours or not private are listed under `ignored_sockets`.
"""

from __future__ import annotations

from typing import Any

from tpu_tools.metrics.agent_client import AgentResult
from tpu_tools.metrics.cacheshare import shared_cache_dirs
from tpu_tools.metrics.global_check import global_metric_findings
from tpu_tools.metrics.goodput import goodput_entry
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceHolders
from tpu_tools.metrics.jobreport import JobLogs
from tpu_tools.metrics.process import ProcessSampler
from tpu_tools.metrics.processfacts import ProcessFacts
from tpu_tools.metrics.slurm import job_id
from tpu_tools.metrics.stall import StallStacks, stall_findings, stalled_for
from tpu_tools.metrics.tpuhealth import health_from_sdk
from tpu_tools.shorten import shorten

DEVICE_KEYS = ("id", "platform", "device_kind", "memory_used_bytes", "memory_peak_bytes", "memory_limit_bytes",
               "live_array_bytes", "live_array_count")
COMPILE_KEYS = ("compile_count", "recompile_count", "trace_count", "trace_time_s", "lowering_time_s",
                "backend_compile_time_s", "cache_hits", "cache_misses", "in_memory_cache_hits")
STEP_KEYS = ("count", "steps_per_second", "last_step_time_s", "p50_step_time_s", "p99_step_time_s",
             "last_step_age_s")
PROCESS_KEYS = ("cpu_percent", "cpu_time_s", "rss_bytes", "threads")


def device_memory_bytes(device: dict[str, Any]) -> int | None:
    """What a device holds for a process: the platform's figure, else its live arrays."""
    used = device.get("memory_used_bytes")
    return used if used is not None else device.get("live_array_bytes")


def sdk_figures(snapshot: dict[str, Any]) -> dict[str, Any] | None:
    """The agent's libtpu SDK read (TensorCore utilization per core), checked; None from older agents."""
    sdk = snapshot.get("tpu_sdk")
    if not isinstance(sdk, dict):
        return None
    cores = sdk.get("tensorcore_utilization_percent")
    utilization = None
    if isinstance(cores, list):
        utilization = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 100
                       else None for v in cores]
    served = sdk.get("metrics")
    metrics: dict[str, Any] = served if isinstance(served, dict) else {}
    unreadable = {str(name): shorten(str(entry.get("error")), 200) for name, entry in metrics.items()
                  if isinstance(entry, dict) and entry.get("error") is not None}
    health = health_from_sdk(metrics)
    age = sdk.get("read_age_s")  # how old the agent's latest complete reading is (its reads run apart)
    return {"status": shorten(str(sdk.get("status")), 200), "tensorcore_utilization_percent": utilization,
            "metrics": sorted(str(name) for name in metrics if str(name) not in unreadable),
            "unreadable": unreadable, "health": health.to_dict() if health is not None else None,
            "read_age_s": float(age) if isinstance(age, (int, float)) and not isinstance(age, bool) else None}


def _total(devices: list[dict[str, Any]], key: str) -> int | None:
    """A figure summed over the devices; unknown where no device knows it (torch_xla counts no live arrays)."""
    known = [d[key] for d in devices if d.get(key) is not None]
    return sum(known) if known else None


def agent_entry(result: AgentResult) -> dict[str, Any]:
    """One entry of the `processes` group from an agent's answer (its figures, or its error); never raises."""
    snapshot = result.snapshot or {}
    process = snapshot.get("process") or {}
    compiles = snapshot.get("compiles") or {}
    devices = [{k: d.get(k) for k in DEVICE_KEYS} for d in snapshot.get("devices") or []]
    memory = [device_memory_bytes(d) for d in devices]
    runtime = snapshot.get("runtime") or {}
    return {
        "pid": result.pid,
        "tag": snapshot.get("tag"),
        "user": snapshot.get("user"),
        "command": snapshot.get("command"),
        "error": result.error,
        "socket": str(result.socket_path),
        "uptime_s": snapshot.get("uptime_s"),
        "jax_version": snapshot.get("jax_version"),
        "frontend": snapshot.get("frontend"),
        "frontend_version": snapshot.get("frontend_version"),
        "platform": runtime.get("platform"),
        **{k: process.get(k) for k in PROCESS_KEYS},
        # unknown, never 0, where no device knows it (torch_xla on the CPU platform)
        "device_memory_used_bytes": sum(m for m in memory if m is not None) if any(m is not None for m in memory)
        else None,
        "live_array_bytes": _total(devices, "live_array_bytes"),
        "live_array_count": _total(devices, "live_array_count"),
        "devices": devices,
        "compiles": ({**{k: compiles.get(k) for k in COMPILE_KEYS},
                      "functions": compiles.get("functions") or [],
                      "recent_recompiles": compiles.get("recent_recompiles") or []} if snapshot else None),
        "steps": {k: (snapshot.get("steps") or {}).get(k) for k in STEP_KEYS} if snapshot else None,
        "compilation_cache": snapshot.get("compilation_cache"),
        "executions": snapshot.get("executions"),
        "transfers": snapshot.get("transfers"),
        "cpu_fallbacks": snapshot.get("cpu_fallbacks"),
        "startup": snapshot.get("startup"),
        "tpu_sdk": sdk_figures(snapshot),
        "goodput": goodput_entry(snapshot),
        "process_index": runtime.get("process_index"),
        "process_count": runtime.get("process_count"),
        "metrics": (snapshot.get("metrics") or {}).get("values") or [],
        "metrics_rejected": (snapshot.get("metrics") or {}).get("rejected"),
        "metrics_error": (snapshot.get("metrics") or {}).get("last_error"),
        "job": snapshot.get("job"),  # the job across restarts (tpu_tools.agent.joblog), null without one
        "query_time_s": result.elapsed_s,
    }


def _ask_stacks(pid: int, timeout_s: float) -> Any:
    from tpu_tools.metrics.agent_client import query_stacks

    return query_stacks(pid, timeout_s)


class ProcessesGroup:
    name = "processes"
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

    def collect(self, context: CollectContext) -> dict[str, Any]:
        scan = context.agents()
        agents = [agent_entry(r) for r in scan.results]
        if context.options.price_per_hour is not None:
            for agent in agents:
                agent["goodput"] = goodput_entry({"goodput": agent["goodput"]}, context.options.price_per_hour)
        agent_pids = {r.pid for r in scan.results}
        self._mark_stalls(agents)
        holders: dict[int, dict[str, Any]] = {}
        discovery = context.discovery()
        held = context.chip_holders()
        for chip in discovery.chips:
            for holder in held[chip.index].holders:
                if holder.pid in agent_pids:
                    continue
                entry = holders.setdefault(holder.pid, {"pid": holder.pid, "user": holder.user,
                                                        "command": holder.command, "chips": []})
                entry["chips"].append(chip.index)
        for pid, entry in holders.items():
            figures = self._sampler.sample(pid)
            entry.update({k: getattr(figures, k) if figures else None for k in PROCESS_KEYS})
        self._sampler.forget_except(set(holders))
        pods_error = self._label_pods(agents, list(holders.values()), discovery, held)
        entries = [*agents, *holders.values()]
        self._slurm_jobs.forget_except({entry["pid"] for entry in entries})
        for entry in entries:
            entry["slurm_job_id"] = self._slurm_jobs.get(entry["pid"])
        if self._pod_labels is not None:
            pods_error = self._read_pod_labels([*agents, *holders.values()]) or pods_error
        return {
            "agents": agents,
            "shared_cache_dirs": [s.to_dict() for s in shared_cache_dirs(agents)],
            "holders": sorted(holders.values(), key=lambda h: h["pid"]),
            "ignored_sockets": [i.to_dict() for i in scan.ignored],
            "pod_labels_error": pods_error,
            "global_metric_findings": global_metric_findings(agents),
            "stall_findings": stall_findings(agents),
            "jobs": [job.to_dict() for job in self._jobs.reports(agents)],
        }

    def _mark_stalls(self, agents: list[dict[str, Any]]) -> None:
        """`stalled_s` on every agent entry, and the `stack` of each stalled one (asked once per step count)."""
        stalled = set()
        for agent in agents:
            agent["stalled_s"] = stalled_for(agent.get("steps")) if not agent.get("error") else None
            if agent["stalled_s"] is not None:
                stalled.add(agent["pid"])
                agent["stack"] = self._stalls.stack(agent["pid"], (agent.get("steps") or {}).get("count"))
        self._stalls.forget_except(stalled)

    def _label_pods(self, agents: list[dict[str, Any]], holders: list[dict[str, Any]], discovery: Any,
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
        entries = [*agents, *holders]
        found, error = self._pods.labels([e["pid"] for e in entries], held)
        for entry in entries:
            owner = found.get(entry["pid"])
            entry["kubernetes"] = ({"namespace": owner.namespace, "pod": owner.pod, "container": owner.container}
                                   if owner else None)
        return error

    def _read_pod_labels(self, entries: list[dict[str, Any]]) -> str | None:
        """Add `labels` (the pod's Kubernetes labels, as label names) to each entry's `kubernetes`; the first
        failure, if any."""
        from tpu_tools.errors import RuntimeFailure

        error = None
        for entry in entries:
            pod = entry.get("kubernetes")
            if pod:
                try:
                    pod["labels"] = self._pod_labels.labels(pod["namespace"], pod["pod"])
                except RuntimeFailure as failure:
                    error = error or str(failure)
        return error

    def close(self) -> None:
        self._pods.client.close()
