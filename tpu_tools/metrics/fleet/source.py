"""The fleet as a report source: `FleetSource.build()` returns a monitor report of every host.

When Prometheus cannot be read, the last good report comes back again with `fleet.stale` true and
`fleet.error` saying why, so a live view keeps its figures and says they are old.

Up to DETAIL_ALL_HOSTS hosts, every `tpu_tools_*` series is read each refresh. A larger fleet whose
Prometheus evaluates deploy/prometheus/records.yml is read through those rules: one summary per host for
the Hosts panel and the outliers, and the chips and jobs of only DETAIL_HOSTS hosts (the outliers, then
the least busy), so a refresh costs the same at ten thousand hosts as at a hundred, bar the summaries.
Where series carry a `cluster` label (many clusters writing to one store), a cluster whose newest sample
is older than `silent_after_s` is named in `fleet.silent_clusters`.
"""

from __future__ import annotations

import re
import time
from typing import Any, TypeVar

import msgspec

import tpu_tools
from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.fleet.client import PrometheusAPI, Sample, parse_url
from tpu_tools.metrics.fleet.records import (
    CLUSTER_LABEL,
    HOST_LABEL,
    PREFIX,
    SUMMARY_RECORDS,
    build_groups,
    host_key,
)
from tpu_tools.metrics.records.devices import DevicesRecord
from tpu_tools.metrics.records.fleet import FleetGroup, SilentCluster
from tpu_tools.metrics.records.group import GroupRecord
from tpu_tools.metrics.records.host import HostRecord
from tpu_tools.metrics.records.jobs import ProcessesGroup
from tpu_tools.metrics.records.report import SCHEMA, MonitorReport
from tpu_tools.metrics.report import iso_time

SERIES_QUERY = '{__name__=~"' + PREFIX + '.+"}'
SUMMARY_QUERY = '{__name__=~"' + "|".join(SUMMARY_RECORDS) + '"}'
# Seconds since each cluster's newest sample (`up` is written with every scrape, whatever the targets).
CLUSTER_AGE_QUERY = f'time() - max by ({CLUSTER_LABEL}) (timestamp(up{{{CLUSTER_LABEL}!=""}}))'
DETAIL_ALL_HOSTS = 64
DETAIL_HOSTS = 16
SILENT_AFTER_S = 120.0  # a few remote-write batches and scrapes of any usual interval


def detail_hosts(fleet: FleetGroup, limit: int = DETAIL_HOSTS) -> list[str]:
    """The hosts whose chips and jobs a large fleet's view reads: the outliers, then the least busy."""
    chosen = [o.host for o in fleet.outliers]
    busy = sorted((h for h in fleet.hosts if h.host not in chosen),
                  key=lambda h: (h.up, h.utilization_percent if h.utilization_percent is not None else -1.0, h.host))
    chosen += [h.host for h in busy]
    return list(dict.fromkeys(chosen))[:limit]


def detail_query(hosts: list[str]) -> str:
    instances = sorted({host.rpartition("/")[2] for host in hosts})
    pattern = "|".join(re.escape(name) for name in instances).replace("\\", "\\\\").replace('"', '\\"')
    return '{__name__=~"' + PREFIX + '.+",' + HOST_LABEL + '=~"' + pattern + '"}'


_G = TypeVar("_G", bound=GroupRecord)


def typed_group(data: dict[str, Any], record_type: type[_G]) -> _G:
    """A fleet group as its record; figures that do not fit it (a series of another type than the exporter
    serves) are the group's error, naming the figure, and the other groups go on."""
    try:
        return msgspec.convert(data, record_type)
    except msgspec.ValidationError as error:
        return record_type(sampled_at=data.get("sampled_at"),
                           error=f"the Prometheus answer does not fit the report: {error}")


class FleetSource:
    def __init__(self, url: str, timeout_s: float = 2.0, silent_after_s: float = SILENT_AFTER_S):
        self.endpoint = parse_url(url)
        self.silent_after_s = silent_after_s
        self._cluster_newest: dict[str, float] = {}  # cluster -> time of its newest sample seen (Unix s)
        self.api = PrometheusAPI(self.endpoint, timeout_s)
        self.sequence = 0
        self._last: MonitorReport | None = None
        self._stale_since: float | None = None

    def build(self) -> MonitorReport:
        now = time.time()
        started = time.monotonic()
        report = MonitorReport(schema=SCHEMA, time=iso_time(now), time_unix_s=round(now, 3),
                               hostname=f"fleet {self.endpoint.shown}", sequence=self.sequence,
                               tpu_tools_version=tpu_tools.__version__)
        self.sequence += 1
        try:
            up = self.api.query("up")
            summaries: list[Sample] | None = self.api.query(SUMMARY_QUERY)
            detail: list[str] | None = None
            if summaries and len({host_key(s.labels) for s in summaries}) > DETAIL_ALL_HOSTS:
                detail = detail_hosts(build_groups([], up, summaries)["fleet"])
                wanted = set(detail)
                series = [s for s in self.api.query(detail_query(detail)) if host_key(s.labels) in wanted]
            else:
                series, summaries = self.api.query(SERIES_QUERY), None
            ages = self.api.query(CLUSTER_AGE_QUERY)
        except RuntimeFailure as error:
            return self._stale(report, str(error), now)
        groups = build_groups(series, up, summaries)
        sampled = iso_time(now)
        for name, group in groups.items():
            if isinstance(group, GroupRecord):
                groups[name] = msgspec.structs.replace(group, period_s=None, sampled_at=sampled)
            else:
                group.update({"period_s": None, "sampled_at": sampled})
                group.setdefault("error", None)
        groups["host"]["hostname"] = report.hostname
        groups["fleet"] = msgspec.structs.replace(
            groups["fleet"], detail_hosts=detail, silent_clusters=self._silent(ages, now), source=self.endpoint.shown,
            stale=False, stale_since=None, query_time_s=round(time.monotonic() - started, 4))
        report = msgspec.structs.replace(report, **{**groups, "host": typed_group(groups["host"], HostRecord),
                                                    "devices": typed_group(groups["devices"], DevicesRecord)})
        self._last, self._stale_since = report, None
        return report

    def _silent(self, ages: list[Sample], now: float) -> list[SilentCluster]:
        """Clusters whose newest sample is older than `silent_after_s`, or that were seen and are gone (a
        cluster's series all marked stale vanish from the store's answers)."""
        for sample in ages:
            self._cluster_newest[sample.labels.get(CLUSTER_LABEL, "?")] = now - sample.value
        return [SilentCluster(cluster=cluster, last_sample_age_s=round(now - newest, 1))
                for cluster, newest in sorted(self._cluster_newest.items()) if now - newest > self.silent_after_s]

    def _stale(self, report: MonitorReport, error: str, now: float) -> MonitorReport:
        if self._stale_since is None:
            self._stale_since = now
        if self._last is None:  # nothing to show yet: every group says why
            failed: dict[str, Any] = {"period_s": None, "sampled_at": report.time, "error": error}
            return msgspec.structs.replace(
                report, host=HostRecord(sampled_at=report.time, error=error),
                devices=DevicesRecord(sampled_at=report.time, error=error),
                processes=ProcessesGroup(sampled_at=report.time, error=error),
                fleet=FleetGroup(**failed, source=self.endpoint.shown, stale=True,
                                 stale_since=iso_time(self._stale_since)))
        last = self._last
        fleet = msgspec.structs.replace(last.fleet or FleetGroup(), error=error, stale=True,
                                        stale_since=iso_time(self._stale_since))
        return msgspec.structs.replace(last, time=report.time, time_unix_s=report.time_unix_s,
                                       sequence=report.sequence, fleet=fleet)

    def close(self) -> None:
        pass
