"""What a report group is, and the per-round context groups share.

A collector is created once per monitor run and asked `collect(context)` each
time its period is due; it returns the group's record (tpu_tools.metrics.records,
or a dict for a group without one yet). Whatever it
raises becomes the group's `error` string: one failing group never costs the
rest of the report. The context fetches the inputs several groups need
(passive discovery, agent snapshots, per-device figures of every source) once
per round, on first use.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tpu_tools.metrics.agent_client import DEFAULT_TIMEOUT_S, AgentConnections, AgentScan, query_agents
from tpu_tools.metrics.libtpu.addresses import DEFAULT_TIMEOUT_S as METRICS_TIMEOUT_S
from tpu_tools.metrics.libtpu.addresses import default_address
from tpu_tools.metrics.records.devices import DeviceExtra
from tpu_tools.metrics.records.group import GroupRecord
from tpu_tools.pjrt.discover import Discovery, Holder, discover
from tpu_tools.pjrt.pairing import GPU_PLATFORMS

_T = TypeVar("_T")


@dataclass
class DeviceFigures:
    """Runtime figures of one local accelerator device from a source other than the agent.

    `device_id` is the device's local id on `platform` (the PJRT id of an
    addressable device; libtpu's device ordinal). A field left None is not
    reported by the source; `extra` holds the figures one kind of source reads
    (libtpu's HBM bandwidth, a GPU's power and temperature, tpu-diag's verdict).
    """

    platform: str
    device_id: int
    source: str
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_percent: float | None = None
    extra: DeviceExtra = field(default_factory=DeviceExtra)
    # The processes on the device as the vendor's library lists them (NVML's compute and graphics processes);
    # None where the source does not say, and the device nodes' holders stand.
    holders: list[Holder] | None = None


DEVICE_NODES = "device_nodes"  # holders_source of holders found by the processes that hold a device node open


@dataclass
class DeviceHolders:
    """Who holds one discovered chip, and which source named them: the vendor's library (`nvml`, `amdsmi`)
    where it answered for the chip, else `device_nodes` (passive discovery's /proc scan)."""

    holders: list[Holder]
    source: str


@dataclass
class CollectOptions:
    """What a monitor run asks of its groups."""

    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    tag_filter: re.Pattern[str] | None = None
    metrics_addresses: list[str] = field(default_factory=lambda: [default_address()])  # libtpu's metrics services
    metrics_timeout_s: float = METRICS_TIMEOUT_S  # deadline of every call to them
    group_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # extra keys from the config
    price_per_hour: float | None = None  # of this machine, for the jobs' cost per 1M samples
    pod_labels: bool = False  # read the Kubernetes labels of the pods that hold devices (--pod-labels)


class CollectContext:
    """One round's shared inputs, each fetched on first use and then reused within the round."""

    def __init__(self, options: CollectOptions, collectors: dict[str, GroupCollector],
                 agent_connections: AgentConnections | None = None):
        self.options = options
        self._collectors = collectors
        self._agent_connections = agent_connections  # kept between rounds by the caller
        self._memo: dict[str, Any] = {}
        self._agents_asked: Future[AgentScan] | None = None

    def ask_agents_early(self, executor: Executor) -> None:
        """Start this round's agent queries now, on `executor`: the agents build their answers while the round
        samples everything else, rather than after it (on a host whose cores the jobs fill, a job then pays for
        its agent's answer beside the monitor's own round, not in a second moment after it)."""
        if self._agents_asked is None and "agents" not in self._memo:
            self._agents_asked = executor.submit(self._query_agents)

    def _query_agents(self) -> AgentScan:
        return query_agents(self.options.agent_timeout_s, tag_filter=self.options.tag_filter,
                            connections=self._agent_connections)

    def memo(self, key: str, fetch: Callable[[], _T]) -> _T:
        """Fetch once per round under `key` (a source's connection result, say) and reuse."""
        if key not in self._memo:
            self._memo[key] = fetch()
        value: _T = self._memo[key]
        return value

    def discovery(self) -> Discovery:
        return self.memo("discovery", discover)

    def agents(self) -> AgentScan:
        asked = self._agents_asked
        return self.memo("agents", asked.result if asked is not None else self._query_agents)

    def device_figures(self) -> list[DeviceFigures]:
        """Per-device figures from every collector that has them; a failing source adds nothing."""
        def gather() -> list[DeviceFigures]:
            figures: list[DeviceFigures] = []
            for collector in self._collectors.values():
                method = getattr(collector, "device_figures", None)
                if method is None:
                    continue
                try:
                    figures.extend(method(self))
                except Exception:  # noqa: BLE001 its own group reports the error
                    continue
            return figures

        return self.memo("device_figures", gather)


    def chip_holders(self) -> dict[int, DeviceHolders]:
        """{chip index: its holders and their source}: a vendor library's list where one answered for the chip
        (a GPU source's `DeviceFigures.holders`, placed as the devices group places GPUs), else the device
        nodes' holders."""
        def build() -> dict[int, DeviceHolders]:
            chips = self.discovery().chips
            found = {chip.index: DeviceHolders(chip.holders, DEVICE_NODES) for chip in chips}
            gpus = [chip for chip in chips if chip.platform in GPU_PLATFORMS]
            for figures in self.device_figures():
                if figures.holders is not None and figures.platform == "gpu" and 0 <= figures.device_id < len(gpus):
                    found[gpus[figures.device_id].index] = DeviceHolders(figures.holders, figures.source)
            return found

        return self.memo("chip_holders", build)


class GroupCollector(Protocol):
    """One group of the report.

    name: the key in the report. default_period_s: None means every report.
    collect(context): the group's record (its `record_type`, a GroupRecord
    whose `period_s` and `sampled_at` the report fills; the record type is
    also what a failed group is made of). Optional: `device_figures(context) ->
    list[DeviceFigures]` for sources with per-device figures, and
    `prometheus(data) -> iterable of prometheus_client metric families` for
    exposition of the group's own figures; `close()` to release connections;
    `reads_agents = True` for a group that reads `context.agents()` whenever
    it is collected (the report then asks the agents as its round starts).
    """

    name: str
    record_type: type[GroupRecord]

    def collect(self, context: CollectContext) -> GroupRecord: ...


def load_collector(name: str, options: CollectOptions) -> GroupCollector:
    """A new collector of report group `name` (a key of GROUPS), imported on first use. KeyError for an unknown name."""
    from tpu_tools.metrics.groups import GROUPS

    module_name, _, class_name = GROUPS[name].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    collector: GroupCollector = cls(options)
    return collector
