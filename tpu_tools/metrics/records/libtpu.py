"""The `libtpu` group: what each of libtpu's runtime metrics services answered, as a report holds it.

One `LibtpuService` per address read (its read in `metrics.libtpu.records.LibtpuSnapshot`, which keeps the
buckets Prometheus needs); a figure the runtime does not serve is None and its metric is named in
`not_served_metrics`, an address that did not answer has `error` set.
"""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.group import GroupRecord


class Distribution(msgspec.Struct, kw_only=True):
    """A libtpu distribution's summary; every figure None when it has no samples. The unit is in the name of the
    field that holds it (`hlo_execution_time_us`, `latency_us`, `rate_mbps`)."""

    count: int = 0
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None


class LibtpuDevice(msgspec.Struct, kw_only=True):
    """One device as the serving runtime numbers it (its local device id)."""

    device_id: int
    hbm_used_bytes: int | None = None
    hbm_total_bytes: int | None = None
    duty_cycle_percent: float | None = None
    hbm_bandwidth_utilization_percent: float | None = None
    tensorcore_idle_duration_s: float | None = None
    hlo_queue_size: int | None = None
    hlo_execution_time_us: Distribution | None = None


class TransferLatency(msgspec.Struct, kw_only=True):
    """A multi-slice latency distribution for one buffer size."""

    metric: str  # the full metric name
    name: str  # its short name
    buffer_size: str  # as the runtime labels it, e.g. "8MB"; "all" when unlabelled
    latency_us: Distribution


class DeliveryRate(msgspec.Struct, kw_only=True):
    """A multi-slice rate distribution (megabits per second) for one label value."""

    metric: str
    name: str
    label: str  # the runtime's buffer-size or peer label; "all" when unlabelled
    rate_mbps: Distribution


class LibtpuService(msgspec.Struct, kw_only=True):
    """One address's answer (or why it gave none)."""

    address: str
    error: str | None = None
    elapsed_ms: float = 0.0
    served_metrics: list[str] = msgspec.field(default_factory=list)
    not_served_metrics: list[str] = msgspec.field(default_factory=list)  # read by tpu-tools, not served there
    unread_metrics: list[str] = msgspec.field(default_factory=list)  # served there, not read by tpu-tools
    duty_cycle_scope: str | None = None  # "device" or "chip": how the runtime keys its duty cycle
    devices: list[LibtpuDevice] = msgspec.field(default_factory=list)
    transfer_latencies: list[TransferLatency] = msgspec.field(default_factory=list)
    delivery_rates: list[DeliveryRate] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class LibtpuGroup(GroupRecord, kw_only=True):
    """Every address read this round; `error` only when none answered."""

    services: list[LibtpuService] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
