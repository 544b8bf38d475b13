"""Monitor reports: every group's figures in one document, schema `tpu-tools/monitor/v1`.

`ReportBuilder.build()` runs one round: each group whose period is due is
collected again (others repeat their last figures with their `sampled_at`
time), and whatever a group raises becomes its `error` instead of failing
the report. tpu-monitor prints these documents; tpu-top renders them;
Prometheus exposition reads the latest one.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import msgspec

import tpu_tools
from tpu_tools.background import DaemonExecutor
from tpu_tools.errors import first_line
from tpu_tools.metrics.agent_client import AgentConnections
from tpu_tools.metrics.groups import GROUPS
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, GroupCollector, load_collector
from tpu_tools.metrics.records.report import SCHEMA, GroupRecord, MonitorReport
from tpu_tools.metrics.records.slice import TpuSlice
from tpu_tools.pjrt.tpuvm import SliceInfo, slice_info

__all__ = ["SCHEMA", "GroupPlan", "ReportBuilder", "iso_time"]


def iso_time(unix_s: float) -> str:
    """A Unix time as ISO 8601 UTC with milliseconds: "2026-11-22T19:49:51.796Z"."""
    return datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class GroupPlan:
    name: str
    period_s: float | None = None  # None: every report


class ReportBuilder:
    def __init__(self, plan: list[GroupPlan] | None = None, options: CollectOptions | None = None,
                 report_period_s: float | None = None, tpu_slice: SliceInfo | None = None):
        self.options = options or CollectOptions()
        # Read once: a host does not change slices while it runs (the metadata server only on a GCE VM).
        self.tpu_slice = tpu_slice if tpu_slice is not None else slice_info(
            metadata_timeout_s=min(self.options.metrics_timeout_s, 1.0))
        self._slice_record = TpuSlice.of(self.tpu_slice)
        self.plan = plan if plan is not None else [GroupPlan(name) for name in GROUPS]
        self.report_period_s = report_period_s
        self.collectors: dict[str, GroupCollector] = {}
        self.agent_connections = AgentConnections()  # one per agent, kept from round to round
        self._last: dict[str, GroupRecord] = {}  # group name -> its last record
        self._due: dict[str, float] = {}
        self.sequence = 0
        self._early = DaemonExecutor(1, "tpu-tools-agents-early")  # a hung agent never holds the program's exit
        for group in self.plan:
            self.collectors[group.name] = load_collector(group.name, self.options)

    def _period(self, group: GroupPlan) -> float | None:
        return group.period_s if group.period_s is not None else self.report_period_s

    def build(self) -> MonitorReport:
        now = time.time()
        monotonic = time.monotonic()
        context = CollectContext(self.options, self.collectors, self.agent_connections)
        due_now = [group for group in self.plan if self._is_due(group, monotonic)]
        if any(getattr(self.collectors[group.name], "reads_agents", False) for group in due_now):
            context.ask_agents_early(self._early)
        for group in due_now:
            self._last[group.name] = self._collect(group, context)
            period = self._period(group)
            if period is not None:
                # Keep to the schedule; after a slow round, start again from now.
                due = self._due.get(group.name, monotonic) + period
                self._due[group.name] = due if due > monotonic else monotonic + period
        # each group's record in the field of its name (which mypy cannot pair with the field's type)
        report = MonitorReport(
            schema=SCHEMA, time=iso_time(now), time_unix_s=round(now, 3), hostname=socket.gethostname(),
            sequence=self.sequence, tpu_tools_version=tpu_tools.__version__, tpu_slice=self._slice_record,
            **{group.name: self._last[group.name] for group in self.plan})  # type: ignore[arg-type]
        self.sequence += 1
        return report

    def _is_due(self, group: GroupPlan, monotonic: float) -> bool:
        # Reports are scheduled on their own clock: a group is due when its time falls within half a report
        # period, so a group with the report's own period is collected in every report.
        due = self._due.get(group.name)
        slack = 0.5 * self.report_period_s if self.report_period_s else 0.001
        return due is None or monotonic >= due - slack or group.name not in self._last

    def _collect(self, group: GroupPlan, context: CollectContext) -> GroupRecord:
        started = time.time()
        period, sampled = self._period(group), iso_time(started)
        collector = self.collectors[group.name]
        try:
            data = collector.collect(context)
        except Exception as error:  # noqa: BLE001 the group reports its failure; the report goes on
            return collector.record_type(period_s=period, sampled_at=sampled, error=first_line(error))
        # the record's own error stands: a group may fail in part and still give its figures
        return msgspec.structs.replace(data, period_s=period, sampled_at=sampled)

    def close(self) -> None:
        self.agent_connections.close()
        for collector in self.collectors.values():
            close = getattr(collector, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 closing a group is best effort; the others still close
                    pass
