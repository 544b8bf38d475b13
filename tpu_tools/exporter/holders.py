"""Who holds each device, as labels for its series: the holder's `tag` (its agent's), Kubernetes `namespace`,
`pod` and `container`, and `slurm_job_id`.

Drawn from one report: the devices group's holders and agent processes of each device, the GPU groups'
processes of each GPU, and the processes group's entries for those pids (tag, pod, Slurm job). Where several
processes hold a device, each label takes the first value found, agents first, then by pid. Values come
from outside (a job chooses its tag, a pod its names): every one is made printable and bounded
(labeltext.label_value).
"""

from __future__ import annotations

from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.gpu import GpuProcess
from tpu_tools.metrics.records.jobs import AgentEntry, Holder
from tpu_tools.metrics.records.report import MonitorReport

HOLDER_LABELS = ("tag", "namespace", "pod", "container", "slurm_job_id")


def _process_identity(entry: AgentEntry | Holder) -> dict[str, str]:
    pod = entry.kubernetes
    found = {"tag": entry.tag if isinstance(entry, AgentEntry) else None, "slurm_job_id": entry.slurm_job_id,
             **({"namespace": pod.namespace, "pod": pod.pod, "container": pod.container} if pod is not None else {})}
    labels = {key: label_value(str(value)) for key, value in found.items() if value}
    # --pod-labels: the pod's own labels, already named and bounded (kube/api.py)
    pod_labels = pod.labels if pod is not None and isinstance(pod.labels, dict) else {}
    return {**{key: value for key, value in pod_labels.items() if key not in labels}, **labels}


def _gpu_process_identity(process: GpuProcess) -> dict[str, str]:
    found = {"tag": process.tag, "slurm_job_id": process.slurm_job_id}
    return {key: label_value(str(value)) for key, value in found.items() if value}


def device_holders(report: MonitorReport) -> dict[str, dict[str, str]]:
    """{device key: {label: value}} for every device whose holders tell something (only the labels known)."""
    processes = report.processes
    identity: dict[int, dict[str, str]] = {}
    entries: list[AgentEntry | Holder] = [*processes.agents, *processes.holders] if processes is not None else []
    for entry in entries:
        if entry.pid not in identity:
            identity[entry.pid] = _process_identity(entry)
    candidates: dict[str, list[int]] = {}
    for device in report.devices.devices if report.devices is not None else []:
        candidates[device.key] = [*(p.pid for p in device.processes), *sorted(h.pid for h in device.holders)]
    for group in (report.nvml, report.amdsmi):
        for gpu in group.gpus if group is not None else []:
            if gpu.device_key:
                for process in gpu.processes:  # a process without an agent: its own tag and Slurm job
                    identity.setdefault(process.pid, _gpu_process_identity(process))
                candidates.setdefault(gpu.device_key, []).extend(sorted(p.pid for p in gpu.processes))
    labels: dict[str, dict[str, str]] = {}
    for key, pids in candidates.items():
        known = [identity[pid] for pid in pids if pid in identity]
        names = [*HOLDER_LABELS, *sorted({name for i in known for name in i} - set(HOLDER_LABELS))]
        found = {label: next((i[label] for i in known if i.get(label)), "") for label in names}
        if any(found.values()):
            labels[key] = {label: value for label, value in found.items() if value}
    return labels
