"""The groups of a monitor report, one module each, registered in `GROUPS`.

A group collector turns one sampling round (`CollectContext`) into its part
of the report. To add a source (as `libtpu` reads libtpu's runtime metrics service):
write a module with a collector class (see `base.GroupCollector`), add one line
to `GROUPS` below, and, if it has per-device figures, return them from its
`device_figures` method so the devices group, Prometheus and tpu-top's
device panel show them.
"""

from __future__ import annotations

# Report key -> "module:class". Order is the order in the report.
GROUPS: dict[str, str] = {
    "host": "tpu_tools.metrics.groups.host:HostGroup",
    "devices": "tpu_tools.metrics.groups.devices:DevicesGroup",
    "processes": "tpu_tools.metrics.groups.processes:ProcessesGroup",
    "libtpu": "tpu_tools.metrics.groups.libtpu:LibtpuGroup",
    "workload": "tpu_tools.metrics.groups.workload:WorkloadGroup",
    "nvml": "tpu_tools.metrics.groups.nvml:NvmlGroup",
    "amdsmi": "tpu_tools.metrics.groups.amdsmi:AmdSmiGroup",
    "diag": "tpu_tools.metrics.groups.diag:DiagGroup",
}
