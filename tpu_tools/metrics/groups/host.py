"""The `host` group: CPU, memory, swap and load of this machine."""

from __future__ import annotations

from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
from tpu_tools.metrics.records.host import HostRecord
from tpu_tools.metrics.system import HostSampler


class HostGroup:
    name = "host"
    record_type = HostRecord

    def __init__(self, options: CollectOptions):
        self._sampler = HostSampler()

    def collect(self, context: CollectContext) -> HostRecord:
        return self._sampler.sample()

    def close(self) -> None:
        self._sampler.close()
