"""`tpu_tools_build_info`: one series (value 1) whose labels say which stack this host runs.

Labels: `version` (tpu-tools), `jax`, `jaxlib` and `libtpu` as installed beside the exporter (a job in
another environment or container may run others: its agent reports its own jax in the processes group),
`driver` (the NVIDIA or AMD driver the GPU group read; empty on a TPU host, whose kernel driver has no version
to read), `platform` (the accelerators' PJRT platform found on the host: tpu, cuda, rocm, else cpu) and
`accelerator_type` (the TPU slice's type, v5litepod-8, else the first accelerator's name). An unknown value is
empty. A dashboard joins it on `instance` to show, or group by, what each host runs.
"""

from __future__ import annotations

import functools

from prometheus_client.core import GaugeMetricFamily

from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.devices import Device
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.pjrt.pairing import GPU_PLATFORMS
from tpu_tools.versions import StackVersions, stack_versions

NAME = "tpu_tools_build_info"
LABELS = ["version", "jax", "jaxlib", "libtpu", "driver", "platform", "accelerator_type"]


@functools.cache
def _versions() -> StackVersions:
    """Read once: what is installed does not change under a running exporter."""
    return stack_versions()


def _accelerators(report: MonitorReport) -> list[Device]:
    devices = report.devices.devices if report.devices is not None else []
    return [d for d in devices if d.platform in ("tpu", *GPU_PLATFORMS)]


def build_info_values(report: MonitorReport) -> dict[str, str]:
    """The labels' values for one report (see the module's docstring)."""
    versions = _versions()
    libtpu = next((v for name, v in versions.plugins.items() if name.startswith("libtpu")), "")
    driver = ""
    for data in (report.nvml, report.amdsmi):
        if data is not None and data.driver_version:
            driver = data.driver_version
            break
    accelerators = _accelerators(report)
    platform = str(accelerators[0].platform) if accelerators else "cpu"
    accelerator_type = (report.tpu_slice.accelerator_type if report.tpu_slice is not None else None) or (
        accelerators[0].name if accelerators else "")
    values = {"version": versions.tpu_tools, "jax": versions.jax or "", "jaxlib": versions.jaxlib or "",
              "libtpu": libtpu, "driver": driver, "platform": platform, "accelerator_type": accelerator_type or ""}
    return {key: label_value(str(value)) for key, value in values.items()}


def build_info_family(report: MonitorReport) -> GaugeMetricFamily:
    family = GaugeMetricFamily(NAME, "Which stack this host runs (versions, platform, accelerator type), value 1.",
                               labels=LABELS)
    values = build_info_values(report)
    family.add_metric([values[label] for label in LABELS], 1.0)
    return family
