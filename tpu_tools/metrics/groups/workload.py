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
from tpu_tools.metrics.records.jobs import WorkloadGroup as Workload

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

    record_type = Workload

    def __init__(self, options: CollectOptions):
        self._timeout_s = options.metrics_timeout_s

    def collect(self, context: CollectContext) -> Workload:
        return Workload(endpoints=read_job_metrics(self._timeout_s), device_plugin=read_plugin(self._timeout_s))

    def prometheus(self, data: Workload) -> Iterable[Any]:
        return prometheus_families(data)


def prometheus_families(data: Workload) -> Iterable[Any]:
    """The group's families: the job's own samples under tpu_tools_ names, the device plugin's figures."""
    from tpu_tools.metrics.samplefamilies import sample_families

    samples = []
    for endpoint in data.endpoints:
        for family in endpoint.families:
            for sample in family.samples:
                if sample.value is not None:
                    labels = {**sample.labels, "endpoint": endpoint.address}
                    samples.append(GaugeSample(PREFIX + sample.name, family.documentation or
                                               f"{family.source} metric {family.name}", labels, sample.value))
    for accelerator in data.device_plugin.accelerators if data.device_plugin is not None else []:
        labels = {"accelerator_id": accelerator.accelerator_id,
                  **{key: getattr(accelerator, key) or "" for key in ("model", "namespace", "pod", "container")}}
        for figure, (name, scale, documentation) in _PLUGIN_FIGURES.items():
            value = getattr(accelerator, figure)
            if value is not None:
                samples.append(GaugeSample(f"{PREFIX}device_plugin_{name}", documentation, labels, value * scale))
    return sample_families(samples)
