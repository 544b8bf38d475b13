"""The `amdsmi` group: AMD GPUs as AMD's amdsmi reports them, in the records and figures of the nvml group.

Everything works as in the nvml group (one reader per monitor run, every read within the metrics deadline,
GPUs placed on discovery's AMD GPUs by PCI bus id, processes tagged with their agent); the Prometheus
series have the nvml group's names with a vendor="amd" label, and a host without AMD GPUs gets a note
rather than a group error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from tpu_tools.metrics.amdsmi import AmdSmiReader
from tpu_tools.metrics.amdsmi.reader import AmdSmiSnapshot
from tpu_tools.metrics.groups.nvml import NvmlGroup
from tpu_tools.metrics.nvml import NvmlSnapshot
from tpu_tools.metrics.records.gpu import GpusRecord


class AmdSmiGroup(NvmlGroup):
    name = "amdsmi"
    vendor = "amd"
    name_prefix = "AMD "

    def _new_reader(self) -> Any:
        return AmdSmiReader()

    def _versions(self, snapshot: NvmlSnapshot, record: GpusRecord) -> GpusRecord:
        bindings = snapshot.bindings_version if isinstance(snapshot, AmdSmiSnapshot) else None
        return msgspec.structs.replace(record, source="amdsmi", bindings_version=bindings)

    def prometheus(self, data: GpusRecord) -> Iterable[Any]:
        from tpu_tools.metrics.nvml.export import families

        return families(data, vendor="amd")
