"""Names of the metrics libtpu's runtime metrics service serves, and which of them tpu-tools reads."""

from __future__ import annotations

HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_UTILIZATION = "tpu.runtime.hbm.utilization.percent"  # newer libtpu only
TENSORCORE_IDLE = "tpu.runtime.tensorcore.idle_duration.seconds"  # newer libtpu only
HLO_QUEUE_SIZE = "hlo.queue.size.gauge"
HLO_EXECUTION_TIMING = "hlo.execution.timing.distribution.microseconds"

MEGASCALE_PREFIX = "megascale."
# Multi-slice transfer latencies (served only by multi-slice jobs); any other served
# megascale.*.microsecond.*distribution is read as well.
MEGASCALE_LATENCIES = (
    "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution",  # buffer transfers out over DCN
    "megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution",  # ... and in
    "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution",
    "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution",
    "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution",
    "megascale.mxla_compute_latencies.microsecond.cumulative.distribution",  # host compute
    "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution",  # the DCN gRPC connections' RTT
)
# Rates, not latencies: the DCN gRPC connections' TCP delivery rate in megabits per second.
MEGASCALE_RATES = (
    "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution",
)

PER_DEVICE = (HBM_USAGE, HBM_TOTAL, DUTY_CYCLE, HBM_UTILIZATION, TENSORCORE_IDLE, HLO_QUEUE_SIZE,
              HLO_EXECUTION_TIMING)
KNOWN = (*PER_DEVICE, *MEGASCALE_LATENCIES, *MEGASCALE_RATES)

# Field of DeviceFigures -> the metric it comes from (so a consumer can say "not served" per field).
FIELD_METRICS = {
    "hbm_used_bytes": HBM_USAGE,
    "hbm_total_bytes": HBM_TOTAL,
    "duty_cycle_percent": DUTY_CYCLE,
    "hbm_bandwidth_utilization_percent": HBM_UTILIZATION,
    "tensorcore_idle_duration_s": TENSORCORE_IDLE,
    "hlo_queue_size": HLO_QUEUE_SIZE,
    "hlo_execution_time_us": HLO_EXECUTION_TIMING,
}


def is_latency_distribution(name: str) -> bool:
    """A multi-slice latency distribution in microseconds (the family grows with libtpu releases)."""
    return name.startswith(MEGASCALE_PREFIX) and ".microsecond." in name and name.endswith("distribution")


def is_rate_distribution(name: str) -> bool:
    """A multi-slice rate distribution in megabits per second (the TCP delivery rate of DCN connections)."""
    return name.startswith(MEGASCALE_PREFIX) and ".Mbps." in name and name.endswith("distribution")


def is_read(name: str) -> bool:
    """Whether tpu-tools reads this served metric."""
    return name in PER_DEVICE or is_latency_distribution(name) or is_rate_distribution(name)


def short_name(name: str) -> str:
    """"megascale.dcn_transfer_latencies.microsecond.cumulative.distribution" -> "dcn_transfer_latencies"."""
    if name.startswith(MEGASCALE_PREFIX):
        return name[len(MEGASCALE_PREFIX):].split(".", 1)[0]
    return name
