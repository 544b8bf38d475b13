"""The same snapshots as a monitor report group and as Prometheus samples.

Library-neutral: `gauge_samples` and `histogram_samples` return plain samples (name, help, labels, value or
buckets) that an exporter turns into its own metric families (with prometheus-client: one family per name).
Names carry the `tpu_tools_` prefix and their base unit (exporter/naming.py): shares are ratios, libtpu's
microsecond latencies are histograms in seconds and its megabit-per-second rates histograms in bytes per
second, built from the buckets libtpu sends. A figure the runtime does not serve yields no sample at all
rather than a made-up number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_tools.metrics.libtpu.distribution import DistributionSummary
from tpu_tools.metrics.libtpu.records import LibtpuSnapshot
from tpu_tools.metrics.records.libtpu import LibtpuGroup

PREFIX = "tpu_tools_libtpu_"


def report_group(snapshots: Sequence[LibtpuSnapshot], notes: Sequence[str] = ()) -> LibtpuGroup:
    """The group's record: its error is None when any address answered, else why none did."""
    answered = any(s.ok for s in snapshots)
    error = None if answered or not snapshots else "; ".join(s.error or "" for s in snapshots)
    return LibtpuGroup(error=error, services=[s.to_record() for s in snapshots], notes=list(notes))


@dataclass(frozen=True)
class GaugeSample:
    name: str
    documentation: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class HistogramSample:
    """A distribution in base units: cumulative (upper bound, count) pairs ending with +inf, and the sum."""

    name: str
    documentation: str
    labels: dict[str, str]
    buckets: tuple[tuple[float, int], ...]
    sum: float | None


# DeviceFigures field -> (gauge name without prefix, scale to base units, help)
_DEVICE_GAUGES = {
    "hbm_used_bytes": ("hbm_used_bytes", 1.0, "HBM in use on the device, from libtpu's metrics service."),
    "hbm_total_bytes": ("hbm_total_bytes", 1.0, "HBM of the device, from libtpu's metrics service."),
    "duty_cycle_percent": ("duty_cycle_ratio", 0.01,
                           "TensorCore duty cycle from 0 to 1 (of its chip where libtpu keys it by chip)."),
    "hbm_bandwidth_utilization_percent": ("hbm_bandwidth_utilization_ratio", 0.01,
                                          "HBM bandwidth utilization from 0 to 1."),
    "tensorcore_idle_duration_s": ("tensorcore_idle_duration_seconds", 1.0, "Time the TensorCore has been idle."),
    "hlo_queue_size": ("hlo_queue_size", 1.0, "HLO programs queued on the device."),
}
MICROSECOND = 1e-6  # seconds
MEGABIT_PER_SECOND = 1e6 / 8  # bytes per second


def histogram(name: str, documentation: str, labels: dict[str, str], summary: DistributionSummary,
              scale: float) -> HistogramSample:
    """A libtpu distribution as a histogram: its buckets' upper bounds times `scale`, counts made cumulative.

    Without a readable layout the histogram has only the +Inf bucket, which still carries the count and sum.
    """
    buckets: list[tuple[float, int]] = []
    cumulative = 0
    for upper, count in summary.buckets:
        cumulative += count
        if math.isfinite(upper):
            buckets.append((upper * scale, cumulative))
    buckets.append((math.inf, max(summary.count, cumulative)))
    # no samples: a sum of 0 (and so a _count of 0), not a missing one; samples without a readable mean: none
    total = summary.mean * summary.count * scale if summary.mean is not None else 0.0 if not summary.count else None
    return HistogramSample(PREFIX + name, documentation, labels, tuple(buckets), total)


def gauge_samples(snapshots: Sequence[LibtpuSnapshot]) -> list[GaugeSample]:
    """Prometheus gauge samples of libtpu snapshots: `up` per address, then each served figure per device."""
    samples = []
    for snapshot in snapshots:
        address = {"address": snapshot.address}
        samples.append(GaugeSample(f"{PREFIX}up", "1 when libtpu's metrics service at the address answered.",
                                   address, 1.0 if snapshot.ok else 0.0))
        for device in snapshot.devices:
            labels = {**address, "device": str(device.device_id)}
            for figure, (name, scale, documentation) in _DEVICE_GAUGES.items():
                value = getattr(device, figure)
                if value is not None:
                    samples.append(GaugeSample(PREFIX + name, documentation, labels, round(float(value) * scale, 12)))
    return samples


def histogram_samples(snapshots: Sequence[LibtpuSnapshot]) -> list[HistogramSample]:
    """libtpu's distributions as histograms in base units: HLO execution time, transfer latency, delivery rate."""
    samples = []
    for snapshot in snapshots:
        address = {"address": snapshot.address}
        for device in snapshot.devices:
            if device.hlo_execution_time_us is not None:
                samples.append(histogram("hlo_execution_time_seconds", "HLO execution time.",
                                         {**address, "device": str(device.device_id)}, device.hlo_execution_time_us,
                                         MICROSECOND))
        for latency in snapshot.transfer_latencies:
            labels = {**address, "metric": latency.name, "buffer_size": latency.buffer_size}
            samples.append(histogram("transfer_latency_seconds", "Multi-slice transfer latency.", labels,
                                     latency.latency_us, MICROSECOND))
        for rate in snapshot.delivery_rates:
            labels = {**address, "metric": rate.name, "label": rate.label}
            samples.append(histogram("tcp_delivery_rate_bytes_per_second", "DCN TCP delivery rate.", labels,
                                     rate.rate_mbps, MEGABIT_PER_SECOND))
    return samples
