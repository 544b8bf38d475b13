"""What one read of a libtpu metrics service yields: plain records for every consumer.

One `LibtpuSnapshot` per address and refresh. The same record feeds a table (tpu-ls), a report
group and Prometheus gauges (tpu-monitor), a terminal panel (tpu-top) and a support bundle (tpu-dump):
`to_record()` is the form a report holds (metrics.records.libtpu) and `to_dict()` its JSON. A figure the
runtime does not serve is None, and its metric is named in `not_served_metrics`; an address that did not answer
has `error` set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tpu_tools.metrics.libtpu import names
from tpu_tools.metrics.libtpu.distribution import DistributionSummary
from tpu_tools.metrics.records.libtpu import DeliveryRate as DeliveryRateRecord
from tpu_tools.metrics.records.libtpu import LibtpuDevice, LibtpuService
from tpu_tools.metrics.records.libtpu import TransferLatency as TransferLatencyRecord

NOT_SERVED = "not served by this runtime"
NO_SAMPLES = "no samples"

DUTY_PER_DEVICE = "device"
DUTY_PER_CHIP = "chip"


def _builtins(record: msgspec.Struct) -> dict[str, Any]:
    return msgspec.to_builtins(record)  # type: ignore[no-any-return]


@dataclass
class DeviceFigures:
    """One device as the serving runtime numbers it (its local device id)."""

    device_id: int
    hbm_used_bytes: int | None = None
    hbm_total_bytes: int | None = None
    duty_cycle_percent: float | None = None
    hbm_bandwidth_utilization_percent: float | None = None
    tensorcore_idle_duration_s: float | None = None
    hlo_queue_size: int | None = None
    hlo_execution_time_us: DistributionSummary | None = None

    def to_record(self) -> LibtpuDevice:
        """The device as the report's libtpu group carries it."""
        return LibtpuDevice(
            device_id=self.device_id, hbm_used_bytes=self.hbm_used_bytes, hbm_total_bytes=self.hbm_total_bytes,
            duty_cycle_percent=self.duty_cycle_percent,
            hbm_bandwidth_utilization_percent=self.hbm_bandwidth_utilization_percent,
            tensorcore_idle_duration_s=self.tensorcore_idle_duration_s, hlo_queue_size=self.hlo_queue_size,
            hlo_execution_time_us=self.hlo_execution_time_us.to_record() if self.hlo_execution_time_us else None)

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form (what `to_record` gives, as plain data)."""
        return _builtins(self.to_record())


@dataclass
class TransferLatency:
    """A multi-slice latency distribution for one buffer size (all data points of that size merged)."""

    metric: str  # the full metric name
    buffer_size: str  # as the runtime labels it, e.g. "8MB"; "all" when unlabelled
    latency_us: DistributionSummary

    @property
    def name(self) -> str:
        return names.short_name(self.metric)

    def to_record(self) -> TransferLatencyRecord:
        """The distribution as the report's libtpu group carries it."""
        return TransferLatencyRecord(metric=self.metric, name=self.name, buffer_size=self.buffer_size,
                                     latency_us=self.latency_us.to_record())

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form (what `to_record` gives, as plain data)."""
        return _builtins(self.to_record())


@dataclass
class DeliveryRate:
    """A multi-slice rate distribution (megabits per second) for one label value, all data points merged."""

    metric: str  # the full metric name
    label: str  # the runtime's buffer-size or peer label; "all" when unlabelled
    rate_mbps: DistributionSummary

    @property
    def name(self) -> str:
        return names.short_name(self.metric)

    def to_record(self) -> DeliveryRateRecord:
        """The distribution as the report's libtpu group carries it."""
        return DeliveryRateRecord(metric=self.metric, name=self.name, label=self.label,
                                  rate_mbps=self.rate_mbps.to_record())

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form (what `to_record` gives, as plain data)."""
        return _builtins(self.to_record())


@dataclass
class UsageFigures:
    """HBM and duty cycle of a group of devices (a chip), for views that show one row per chip."""

    hbm_used_bytes: int | None = None
    hbm_total_bytes: int | None = None
    duty_cycle_percent: float | None = None

    @classmethod
    def combine(cls, devices: Sequence[DeviceFigures]) -> UsageFigures:
        def total(values: list[int | None]) -> int | None:
            return None if not values or any(v is None for v in values) else sum(values)  # type: ignore[arg-type]

        duty = [d.duty_cycle_percent for d in devices if d.duty_cycle_percent is not None]
        return cls(hbm_used_bytes=total([d.hbm_used_bytes for d in devices]),
                   hbm_total_bytes=total([d.hbm_total_bytes for d in devices]),
                   duty_cycle_percent=sum(duty) / len(duty) if duty else None)

    def to_dict(self) -> dict[str, Any]:
        return {"hbm_used_bytes": self.hbm_used_bytes, "hbm_total_bytes": self.hbm_total_bytes,
                "duty_cycle_percent": self.duty_cycle_percent}


@dataclass
class LibtpuSnapshot:
    """What one libtpu runtime metrics service answered: the metrics it serves and each device's figures."""

    address: str
    error: str | None = None  # a sentence: the address did not answer, or answered nothing usable
    served_metrics: list[str] = field(default_factory=list)  # as the service lists them
    not_served_metrics: list[str] = field(default_factory=list)  # names tpu-tools reads that it does not serve
    unread_metrics: list[str] = field(default_factory=list)  # served names tpu-tools does not read
    duty_cycle_scope: str | None = None  # "device" or "chip": how the runtime keys its duty cycle
    devices: list[DeviceFigures] = field(default_factory=list)
    transfer_latencies: list[TransferLatency] = field(default_factory=list)
    delivery_rates: list[DeliveryRate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # data points skipped, device ids that disagree, ...
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the service answered with something usable."""
        return self.error is None

    def serves(self, metric: str) -> bool:
        """Whether the service lists `metric` (its full name) among those it serves."""
        return metric in self.served_metrics

    def serves_field(self, figure: str) -> bool:
        """Whether a DeviceFigures field ("duty_cycle_percent", ...) has a metric behind it here."""
        return self.ok and self.serves(names.FIELD_METRICS[figure])

    def device(self, device_id: int) -> DeviceFigures | None:
        """The figures of the device the runtime numbers `device_id`, or None."""
        return next((d for d in self.devices if d.device_id == device_id), None)

    def to_record(self) -> LibtpuService:
        """The snapshot as the report's libtpu group carries it (one service of the group)."""
        return LibtpuService(
            address=self.address, error=self.error, elapsed_ms=round(self.elapsed_ms, 3),
            served_metrics=list(self.served_metrics), not_served_metrics=list(self.not_served_metrics),
            unread_metrics=list(self.unread_metrics), duty_cycle_scope=self.duty_cycle_scope,
            devices=[d.to_record() for d in self.devices],
            transfer_latencies=[t.to_record() for t in self.transfer_latencies],
            delivery_rates=[r.to_record() for r in self.delivery_rates], notes=list(self.notes))

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form (what `to_record` gives, as plain data)."""
        return _builtins(self.to_record())


# --- runtime status ---------------------------------------------------------------------------------

@dataclass
class SequencerState:
    sequencer_type: str  # "tensor_core", "sparse_core", ... or "unknown"
    index: int | None = None
    pc: int | None = None
    tag: int | None = None
    tracemark: int | None = None
    program_id: int | None = None
    run_id: int | None = None
    hlo_location: str | None = None
    hlo_detailed_info: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sequencer_type": self.sequencer_type, "index": self.index, "pc": self.pc, "tag": self.tag,
                "tracemark": self.tracemark, "program_id": self.program_id, "run_id": self.run_id,
                "hlo_location": self.hlo_location, "hlo_detailed_info": self.hlo_detailed_info}


@dataclass
class QueuedProgram:
    run_id: int | None = None
    launch_id: int | None = None
    program_fingerprint: str | None = None  # hex

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "launch_id": self.launch_id, "program_fingerprint": self.program_fingerprint}


@dataclass
class CoreStatus:
    global_core_id: int
    chip_id: int | None = None
    core_type: str = "unknown"  # "tensor_core", "sparse_core", "sparse_core_v0"
    core_index: int | None = None  # index of the core on its chip
    error_message: str | None = None
    program_fingerprint: str | None = None  # hex
    launch_id: int | None = None
    xdb_server_running: bool | None = None
    sequencers: list[SequencerState] = field(default_factory=list)
    queued_programs: list[QueuedProgram] = field(default_factory=list)

    @property
    def state(self) -> str:
        return "error" if self.error_message else "ok"

    @property
    def current(self) -> SequencerState | None:
        """The sequencer that says what the core runs: the first one that names a program or run."""
        return next((s for s in self.sequencers if s.program_id is not None or s.run_id is not None),
                    self.sequencers[0] if self.sequencers else None)

    def to_dict(self) -> dict[str, Any]:
        return {"global_core_id": self.global_core_id, "chip_id": self.chip_id, "core_type": self.core_type,
                "core_index": self.core_index, "state": self.state, "error_message": self.error_message,
                "program_fingerprint": self.program_fingerprint, "launch_id": self.launch_id,
                "xdb_server_running": self.xdb_server_running,
                "sequencers": [s.to_dict() for s in self.sequencers],
                "queued_programs": [q.to_dict() for q in self.queued_programs]}


@dataclass
class RuntimeStatus:
    """GetTpuRuntimeStatus of one address. served False: the runtime has no such rpc (NOT_SERVED)."""

    address: str
    error: str | None = None
    served: bool = True
    host_name: str | None = None
    cores: list[CoreStatus] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.served

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "error": self.error, "served": self.served, "host_name": self.host_name,
                "cores": [c.to_dict() for c in self.cores]}
