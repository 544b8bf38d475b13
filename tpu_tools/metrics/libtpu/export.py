"""The same snapshots as a monitor report group and as Prometheus gauge samples.

Library-neutral: `gauge_samples` returns plain samples (name, help, labels, value) that an exporter turns
into its own metric families (with prometheus-client: one GaugeMetricFamily per name). Names carry the
`tpu_tools_` prefix and their unit; a figure the runtime does not serve, or a distribution without samples,
yields no sample at all rather than a made-up number.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_tools.metrics.libtpu.distribution import PERCENTILES, DistributionSummary
from tpu_tools.metrics.libtpu.records import LibtpuSnapshot

PREFIX = "tpu_tools_libtpu_"


def report_group(snapshots: Sequence[LibtpuSnapshot]) -> dict[str, Any]:
    """{"error", "services"}: error is null when any address answered, else why none did."""
    answered = any(s.ok for s in snapshots)
    error = None if answered or not snapshots else "; ".join(s.error or "" for s in snapshots)
    return {"error": error, "services": [s.to_dict() for s in snapshots]}


@dataclass(frozen=True)
class GaugeSample:
    name: str
    documentation: str
    labels: dict[str, str]
    value: float


# DeviceFigures field -> (gauge name without prefix, help)
_DEVICE_GAUGES = {
    "hbm_used_bytes": ("hbm_used_bytes", "HBM in use on the device, from libtpu's metrics service."),
    "hbm_total_bytes": ("hbm_total_bytes", "HBM of the device, from libtpu's metrics service."),
    "duty_cycle_percent": ("duty_cycle_percent", "TensorCore duty cycle (of its chip where libtpu keys it by chip)."),
    "hbm_bandwidth_utilization_percent": ("hbm_bandwidth_utilization_percent", "HBM bandwidth utilization."),
    "tensorcore_idle_duration_s": ("tensorcore_idle_duration_seconds", "Time the TensorCore has been idle."),
    "hlo_queue_size": ("hlo_queue_size", "HLO programs queued on the device."),
}


def _distribution(name: str, documentation: str, labels: dict[str, str], summary: DistributionSummary,
                  unit: str = "us", unit_words: str = "microseconds") -> Iterator[GaugeSample]:
    yield GaugeSample(f"{PREFIX}{name}_samples", f"Samples in the {documentation} distribution.", labels,
                      float(summary.count))
    for percentile, quantile in PERCENTILES:
        value = summary.percentile(percentile)
        if value is not None:
            yield GaugeSample(f"{PREFIX}{name}_{unit}", f"{documentation} percentiles, {unit_words}.",
                              {**labels, "quantile": f"{quantile:g}"}, value)


def gauge_samples(snapshots: Sequence[LibtpuSnapshot]) -> list[GaugeSample]:
    """Prometheus gauge samples of libtpu snapshots: `up` per address, then each served figure per device."""
    samples = []
    for snapshot in snapshots:
        address = {"address": snapshot.address}
        samples.append(GaugeSample(f"{PREFIX}up", "1 when libtpu's metrics service at the address answered.",
                                   address, 1.0 if snapshot.ok else 0.0))
        for device in snapshot.devices:
            labels = {**address, "device": str(device.device_id)}
            for figure, (name, documentation) in _DEVICE_GAUGES.items():
                value = getattr(device, figure)
                if value is not None:
                    samples.append(GaugeSample(PREFIX + name, documentation, labels, float(value)))
            if device.hlo_execution_time_us is not None:
                samples.extend(_distribution("hlo_execution_time", "HLO execution time", labels,
                                             device.hlo_execution_time_us))
        for latency in snapshot.transfer_latencies:
            labels = {**address, "metric": latency.name, "buffer_size": latency.buffer_size}
            samples.extend(_distribution("transfer_latency", "multi-slice transfer latency", labels,
                                         latency.latency_us))
        for rate in snapshot.delivery_rates:
            labels = {**address, "metric": rate.name, "label": rate.label}
            samples.extend(_distribution("tcp_delivery_rate", "DCN TCP delivery rate", labels, rate.rate_mbps,
                                         "mbps", "megabits per second"))
    return samples
