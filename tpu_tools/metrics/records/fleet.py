"""The `fleet` group of a report read from Prometheus (`--from-prometheus`): one summary per host, the slice's
outliers and what is wrong with the store itself (a stale read, a silent cluster)."""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.group import GroupRecord
from tpu_tools.metrics.records.jobs import StallFinding


class FleetHost(msgspec.Struct, kw_only=True):
    """One host of the fleet; its figures from its own series, or from the recording rules on a large fleet."""

    host: str  # the Prometheus instance, qualified by its cluster ("cluster/instance") where there is one
    up: bool
    cluster: str | None = None
    chips: int = 0
    utilization_percent: float | None = None  # mean over the host's devices that report it
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    jobs: int = 0
    steps_per_second: float | None = None  # all the host's jobs together
    step_time_s: float | None = None  # median of its jobs' p50 step times
    recompiles: int | None = None
    goodput_percent: float | None = None  # median of its jobs' recent goodput (since start where no recent)
    outlier: str | None = None  # why this host is the slice's outlier


class Outlier(msgspec.Struct, frozen=True):
    """The host of a slice furthest from the median of one figure."""

    host: str
    figure: str  # "utilization_percent" or "step_time_s"
    value: float
    median: float

    @property
    def sentence(self) -> str:
        if self.figure == "utilization_percent":
            return f"utilization {self.value:.1f} % vs median {self.median:.1f} %"
        return f"step time {self.value * 1e3:.1f} ms vs median {self.median * 1e3:.1f} ms"


class DigestOutlier(msgspec.Struct, frozen=True):
    """A host whose tpu-diag GEMM digest differs from most hosts that ran the GEMM under the same key."""

    host: str
    test: str  # "gemm f32"
    key: str  # the comparability key's id (tpu_tools.diag.reference)
    digest: str
    agreeing: int  # hosts with this digest under this key, the host included
    hosts: int  # hosts with this key

    @property
    def sentence(self) -> str:
        return f"{self.test} digest {self.digest} differs from {self.hosts - self.agreeing} of {self.hosts} hosts"


class ClusterSummary(msgspec.Struct, kw_only=True):
    cluster: str
    hosts: int
    hosts_down: int
    median_utilization_percent: float | None = None


class SilentCluster(msgspec.Struct, kw_only=True):
    """A cluster whose newest sample in the store is older than the fleet reader's limit."""

    cluster: str
    last_sample_age_s: float


class FleetGroup(GroupRecord, kw_only=True):
    """The fleet reader's own group. `stale`: Prometheus could not be read and the report is the last good one."""

    hosts: list[FleetHost] = msgspec.field(default_factory=list)
    hosts_down: list[str] = msgspec.field(default_factory=list)
    median_utilization_percent: float | None = None
    median_step_time_s: float | None = None
    outliers: list[Outlier] = msgspec.field(default_factory=list)
    global_metric_findings: int = 0  # how many global metrics differ between workers (the processes group's list)
    digest_outliers: list[DigestOutlier] = msgspec.field(default_factory=list)
    stall_findings: list[StallFinding] = msgspec.field(default_factory=list)  # the processes group's findings
    clusters: list[ClusterSummary] = msgspec.field(default_factory=list)
    detail_hosts: list[str] | None = None  # on a large fleet: the hosts whose chips and jobs were read
    silent_clusters: list[SilentCluster] = msgspec.field(default_factory=list)
    source: str | None = None  # the Prometheus address as shown
    stale: bool = False
    stale_since: str | None = None  # ISO 8601 UTC
    query_time_s: float | None = None
