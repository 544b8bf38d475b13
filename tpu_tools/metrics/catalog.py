"""`--list-metrics`: what each source on this host serves, and what tpu-tools knows that it does not.

Sources: every libtpu runtime metrics service asked (ListSupportedMetrics) and every agent (the libtpu SDK
metrics it reads inside its job). Each metric is "read" (tpu-tools reads and reports it), "served, not
read" (a name this release does not interpret), or "not served" (a name tpu-tools knows that this runtime
did not list), or "unreadable: why" (an SDK metric that failed to read); a source that did not answer
carries its error instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.libtpu import LibtpuSnapshot, names
from tpu_tools.metrics.records.jobs import AgentEntry

SCHEMA = "tpu-tools/list-metrics/v1"
READ = "read"
SERVED_NOT_READ = "served, not read"
NOT_SERVED = "not served"
UNREADABLE = "unreadable"


@dataclass
class MetricEntry:
    name: str
    status: str  # READ, SERVED_NOT_READ, NOT_SERVED, or UNREADABLE with the reason after a colon

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status}


@dataclass
class SourceListing:
    kind: str  # "libtpu" or "agent"
    source: str  # the address, or "pid 1234 (tag)"
    error: str | None = None
    metrics: list[MetricEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source, "error": self.error,
                "metrics": [m.to_dict() for m in self.metrics]}


@dataclass
class MetricCatalog:
    sources: list[SourceListing] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "sources": [s.to_dict() for s in self.sources]}


def libtpu_listing(snapshot: LibtpuSnapshot) -> SourceListing:
    """What one metrics service lists, and the names tpu-tools knows that it does not."""
    listing = SourceListing("libtpu", snapshot.address, error=snapshot.error)
    if not snapshot.ok:
        return listing
    listing.metrics = [MetricEntry(name, READ if names.is_read(name) else SERVED_NOT_READ)
                       for name in snapshot.served_metrics]
    listing.metrics += [MetricEntry(name, NOT_SERVED) for name in snapshot.not_served_metrics]
    return listing


def agent_listing(agent: AgentEntry) -> SourceListing:
    """The libtpu SDK metrics an agent reads in its job (a `processes` group entry)."""
    source = f"pid {agent.pid}" + (f" ({agent.tag})" if agent.tag else "")
    listing = SourceListing("agent", source, error=agent.error)
    sdk = agent.tpu_sdk
    if listing.error is not None:
        return listing
    if sdk is None:
        listing.error = "this agent reads no libtpu SDK metrics (an older tpu-tools)"
        return listing
    if sdk.status != "ok":
        listing.error = str(sdk.status)
        return listing
    listing.metrics = [MetricEntry(name, READ) for name in sdk.metrics]
    listing.metrics += [MetricEntry(name, f"{UNREADABLE}: {why}") for name, why in sdk.unreadable.items()]
    return listing


def build_catalog(snapshots: Sequence[LibtpuSnapshot], agents: Sequence[AgentEntry]) -> MetricCatalog:
    return MetricCatalog([*(libtpu_listing(s) for s in snapshots), *(agent_listing(a) for a in agents)])
