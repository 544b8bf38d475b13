"""The `host` group: this machine's CPU, memory, swap and load."""

from __future__ import annotations

from tpu_tools.metrics.records.group import GroupRecord


class HostRecord(GroupRecord, kw_only=True):
    """A host's figures; a fleet's host panel sums memory and swap over its hosts and averages CPU and load."""

    hostname: str | None = None
    cpu_count: int | None = None
    cpu_percent: float | None = None  # of all cores
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None  # total minus available
    memory_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    load_average_1m: float | None = None
    load_average_5m: float | None = None
    load_average_15m: float | None = None
    uptime_s: float | None = None
