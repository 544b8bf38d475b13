"""The `workload` group: what the job and the node serve besides libtpu and the agents.

Orbax checkpointing and Grain input-pipeline metrics the job exports itself, and, on a GKE node, the TPU
device plugin's per-chip figures with the pod that holds each chip. Each source is read once per round
within the metrics deadline; one that is not there reports its error and costs nothing else. Prometheus
gets the job's samples again under `tpu_tools_` names and the plugin's as `tpu_tools_device_plugin_*`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpu_tools.metrics.deviceplugin import read_plugin
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
from tpu_tools.metrics.jobexport import read_job_metrics
from tpu_tools.metrics.libtpu.export import GaugeSample

PREFIX = "tpu_tools_"
# the plugin's figure -> (series name, scale to base units, help)
_PLUGIN_FIGURES = {
    "duty_cycle_percent": ("duty_cycle_ratio", 0.01, "TPU duty cycle from 0 to 1, as GKE's TPU device plugin "
                                                     "reports it."),
    "memory_used_bytes": ("memory_used_bytes", 1.0, "TPU HBM in use, as GKE's TPU device plugin reports it."),
    "memory_total_bytes": ("memory_total_bytes", 1.0, "TPU HBM, as GKE's TPU device plugin reports it."),
}


class WorkloadGroup:
    name = "workload"

    def __init__(self, options: CollectOptions):
        self._timeout_s = options.metrics_timeout_s

    def collect(self, context: CollectContext) -> dict[str, Any]:
        return {"endpoints": [endpoint.to_dict() for endpoint in read_job_metrics(self._timeout_s)],
                "device_plugin": read_plugin(self._timeout_s).to_dict()}

    def prometheus(self, data: dict[str, Any]) -> Iterable[Any]:
        return prometheus_families(data)


def prometheus_families(data: dict[str, Any]) -> Iterable[Any]:
    """The group's families: the job's own samples under tpu_tools_ names, the device plugin's figures."""
    from tpu_tools.metrics.samplefamilies import sample_families

    samples = []
    for endpoint in data.get("endpoints") or []:
        for family in endpoint.get("families") or []:
            for sample in family.get("samples") or []:
                if sample.get("value") is not None:
                    labels = {**sample.get("labels", {}), "endpoint": endpoint.get("address", "")}
                    samples.append(GaugeSample(PREFIX + sample["name"], family.get("documentation") or
                                               f"{family.get('source')} metric {family.get('name')}",
                                               labels, sample["value"]))
    plugin = data.get("device_plugin") or {}
    for accelerator in plugin.get("accelerators") or []:
        labels = {key: str(accelerator.get(key) or "") for key in ("accelerator_id", "model", "namespace", "pod",
                                                                   "container")}
        for figure, (name, scale, documentation) in _PLUGIN_FIGURES.items():
            if accelerator.get(figure) is not None:
                samples.append(GaugeSample(f"{PREFIX}device_plugin_{name}", documentation, labels,
                                           accelerator[figure] * scale))
    return sample_families(samples)
