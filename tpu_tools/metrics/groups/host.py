"""The `host` group: CPU, memory, swap and load of this machine."""

from __future__ import annotations

from typing import Any

from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
from tpu_tools.metrics.system import HostSampler


class HostGroup:
    name = "host"

    def __init__(self, options: CollectOptions):
        self._sampler = HostSampler()

    def collect(self, context: CollectContext) -> dict[str, Any]:
        return self._sampler.sample().to_dict()
