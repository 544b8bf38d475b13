"""The `amdsmi` group: AMD GPUs as AMD's amdsmi reports them, in the records and figures of the nvml group.

Everything works as in the nvml group (one reader per monitor run, every read within the metrics deadline,
GPUs placed on discovery's AMD GPUs by PCI bus id, processes tagged with their agent); the Prometheus
series have the nvml group's names with a vendor="amd" label, and a host without AMD GPUs gets a note
rather than a group error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpu_tools.metrics.amdsmi import AmdSmiReader
from tpu_tools.metrics.groups.nvml import NvmlGroup


class AmdSmiGroup(NvmlGroup):
    name = "amdsmi"
    vendor = "amd"
    name_prefix = "AMD "

    def _new_reader(self) -> Any:
        return AmdSmiReader()

    def prometheus(self, data: dict[str, Any]) -> Iterable[Any]:
        from tpu_tools.metrics.nvml.export import families

        return families(data, vendor="amd")
