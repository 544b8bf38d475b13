"""Protobuf answers of the metrics service -> records. Lenient: a bad data point becomes a note.

Device ids come in three shapes: an int attribute ("device-id", or "chip-id" for a per-chip duty
cycle), and for the HLO metrics a `device_ordinal` inside a key-value list, an int in older libtpu and
a digit string in newer. Anything else (no id, a non-numeric string, a value of the wrong kind) is
skipped and counted in a note, never raised.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from tpu_tools.metrics.libtpu import names
from tpu_tools.metrics.libtpu.distribution import (
    NO_SAMPLES,
    DistributionSummary,
    Histogram,
    LayoutError,
    explicit,
    exponential,
    linear,
    merge,
    summarize,
)
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb
from tpu_tools.metrics.libtpu.records import (
    DUTY_PER_CHIP,
    DUTY_PER_DEVICE,
    CoreStatus,
    DeliveryRate,
    DeviceFigures,
    LibtpuSnapshot,
    QueuedProgram,
    RuntimeStatus,
    SequencerState,
    TransferLatency,
)
from tpu_tools.parsing import ascii_digits

_ORDINAL_KEYS = ("device_ordinal", "device-ordinal", "device_id", "device-id")
_BUFFER_SIZE_KEYS = ("buffer-size", "buffer_size")
_NO_BUFFER_SIZE = "all"


def _ordinal(value: pb.AttrValue) -> int | None:
    kind = value.WhichOneof("attr")
    if kind == "int_attr":
        return value.int_attr if value.int_attr >= 0 else None
    if kind == "string_attr":
        text = value.string_attr.strip()
        return int(text) if ascii_digits(text) and len(text) <= 18 else None
    if kind == "kvlist_attr":
        entries = {a.key: a.value for a in value.kvlist_attr.attributes}
        for key in _ORDINAL_KEYS:
            if key in entries:
                return _ordinal(entries[key])
    return None


def _string_attribute(attribute: pb.Attribute, keys: tuple[str, ...]) -> str | None:
    if attribute.key in keys and attribute.value.WhichOneof("attr") == "string_attr":
        return str(attribute.value.string_attr)
    if attribute.value.WhichOneof("attr") == "kvlist_attr":
        for entry in attribute.value.kvlist_attr.attributes:
            if entry.key in keys and entry.value.WhichOneof("attr") == "string_attr":
                return str(entry.value.string_attr)
    return None


def _number(point: pb.Metric) -> float | None:
    measure = point.WhichOneof("measure")
    if measure not in ("gauge", "counter"):
        return None
    holder = getattr(point, measure)
    kind = holder.WhichOneof("value")
    if kind in ("as_int", "as_double"):
        value = float(getattr(holder, kind))
    elif kind == "as_string":
        try:
            value = float(holder.as_string)
        except ValueError:
            return None
    else:
        return None
    return value if math.isfinite(value) else None


class _Reader:
    """Decodes the metrics of one address, collecting notes on what it had to skip."""

    def __init__(self, metrics: Mapping[str, pb.TPUMetric]):
        self.metrics = metrics
        self.notes: list[str] = []

    def _skipped(self, name: str, count: int, what: str) -> None:
        if count:
            self.notes.append(f"{name}: skipped {count} data point{'s' if count > 1 else ''} {what}")

    def gauges(self, name: str, *, nonnegative: bool = False,
               percent: bool = False) -> tuple[dict[int, float], str]:
        """Device (or chip) id -> value, and the attribute key the ids came under.

        A value out of its range (negative where it cannot be, a percentage outside 0..100) is unreadable:
        skipped with a note, as a missing one is.
        """
        nonnegative = nonnegative or percent
        values: dict[int, float] = {}
        bad = repeated = 0
        key = ""
        for point in self.metrics[name].metrics if name in self.metrics else ():
            device = _ordinal(point.attribute.value)
            value = _number(point)
            if device is None or value is None or (nonnegative and value < 0) or (percent and value > 100.0):
                bad += 1
            elif device in values:
                repeated += 1
            else:
                values[device] = value
                key = key or point.attribute.key
        self._skipped(name, bad, "with no usable device id or value (missing, not finite or out of range)")
        self._skipped(name, repeated, "repeating a device id (the first was kept)")
        return values, key

    def ids(self, name: str) -> set[int]:
        """Every device (or chip) id the metric's data points name, whatever their values."""
        points = self.metrics[name].metrics if name in self.metrics else ()
        return {device for device in (_ordinal(point.attribute.value) for point in points) if device is not None}

    def histogram(self, name: str, point: pb.Metric) -> Histogram | None:
        if point.WhichOneof("measure") != "distribution":
            return None
        data = point.distribution
        options = data.bucket_options
        layout = options.WhichOneof("options")
        buckets = None
        try:
            if layout == "exponential_buckets":
                e = options.exponential_buckets
                buckets = exponential(e.num_finite_buckets, e.growth_factor, e.scale)
            elif layout == "linear_buckets":
                lin = options.linear_buckets
                buckets = linear(lin.num_finite_buckets, lin.width, lin.offset)
            elif layout == "explicit_buckets":
                buckets = explicit(options.explicit_buckets.bounds)
            elif layout == "regular_buckets":
                raise LayoutError("the deprecated regular bucket layout is not read")
        except LayoutError as error:
            self.notes.append(f"{name}: {error}; percentiles left out")
        if buckets is None and layout is None and sum(data.bucket_counts) > 0:
            self.notes.append(f"{name}: no bucket layout; percentiles left out")
        return Histogram(count=data.count, mean=data.mean, min=data.min, max=data.max, buckets=buckets,
                         counts=list(data.bucket_counts))

    def summary(self, name: str, histograms: list[Histogram]) -> DistributionSummary:
        try:
            return summarize(merge(histograms))
        except LayoutError as error:
            self.notes.append(f"{name}: {error}; percentiles left out")
            count = sum(max(h.count, 0) for h in histograms)
            return DistributionSummary(count=count) if count else NO_SAMPLES

    def per_device_histograms(self, name: str) -> dict[int, DistributionSummary]:
        grouped: dict[int, list[Histogram]] = defaultdict(list)
        bad = 0
        for point in self.metrics[name].metrics if name in self.metrics else ():
            device = _ordinal(point.attribute.value)
            histogram = self.histogram(name, point)
            if device is None or histogram is None:
                bad += 1
            else:
                grouped[device].append(histogram)
        self._skipped(name, bad, "with no usable device_ordinal or distribution")
        return {device: self.summary(name, group) for device, group in grouped.items()}

    def per_device_sums(self, name: str) -> dict[int, int]:
        """Gauges with possibly several data points per device (one per core type): summed."""
        sums: dict[int, int] = defaultdict(int)
        bad = 0
        for point in self.metrics[name].metrics if name in self.metrics else ():
            device = _ordinal(point.attribute.value)
            value = _number(point)
            if device is None or value is None or value < 0:
                bad += 1
            else:
                sums[device] += int(value)
        self._skipped(name, bad, "with no usable device_ordinal or value")
        return dict(sums)

    def latencies(self, name: str) -> list[TransferLatency]:
        return [TransferLatency(name, label, summary) for label, summary in self.labelled_summaries(name)]

    def rates(self, name: str) -> list[DeliveryRate]:
        return [DeliveryRate(name, label, summary) for label, summary in self.labelled_summaries(name)]

    def labelled_summaries(self, name: str) -> list[tuple[str, DistributionSummary]]:
        """The distribution's data points merged per buffer-size label, in size order."""
        grouped: dict[str, list[Histogram]] = defaultdict(list)
        bad = 0
        for point in self.metrics[name].metrics:
            histogram = self.histogram(name, point)
            if histogram is None:
                bad += 1
                continue
            size = _string_attribute(point.attribute, _BUFFER_SIZE_KEYS) or _NO_BUFFER_SIZE
            grouped[size].append(histogram)
        self._skipped(name, bad, "that are not distributions")
        return [(size, self.summary(name, grouped[size])) for size in sorted(grouped, key=_size_order)]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE | re.ASCII)


def _size_order(label: str) -> tuple[int, float, str]:
    match = _SIZE.match(label)
    if not match:
        return (1, 0.0, label)
    factor = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    return (0, float(match.group(1)) * factor, label)


def _assign_duty_cycle(reader: _Reader, figures: dict[int, DeviceFigures], base: list[int]) -> str | None:
    """Put the duty cycle on devices, whether the runtime keys it by device or by chip. Returns the scope."""
    if names.DUTY_CYCLE not in reader.metrics:
        return None
    duty, key = reader.gauges(names.DUTY_CYCLE, percent=True)
    if not duty:
        return None
    # Ids whose value was unreadable still count: they say how the runtime keys its duty cycle.
    chips = sorted(set(duty) | reader.ids(names.DUTY_CYCLE))
    per_chip = len(base) // len(chips) if base and len(base) % len(chips) == 0 else 0
    keyed_by_chip = "chip" in key.lower()
    if per_chip and (keyed_by_chip or per_chip > 1):
        for position, chip in enumerate(chips):
            for device in base[position * per_chip:(position + 1) * per_chip]:
                figures[device].duty_cycle_percent = duty.get(chip)
        return DUTY_PER_CHIP
    if keyed_by_chip and base:
        reader.notes.append(f"{names.DUTY_CYCLE}: {len(chips)} chips do not divide {len(base)} devices; "
                            "the duty cycle is shown by id")
    elif base and set(chips) != set(base):
        reader.notes.append(f"{names.DUTY_CYCLE} reports devices {', '.join(map(str, chips))} but the HBM "
                            f"metrics report {', '.join(map(str, base))}")
    for device, value in duty.items():
        figures.setdefault(device, DeviceFigures(device)).duty_cycle_percent = value
    return DUTY_PER_DEVICE


def _note_mismatched_ids(reader: _Reader, ids_by_metric: dict[str, set[int]]) -> None:
    present = {name: ids for name, ids in ids_by_metric.items() if ids}
    everything = set().union(*present.values()) if present else set()
    for name, ids in present.items():
        missing = sorted(everything - ids)
        if missing:
            reader.notes.append(f"{name} has no data for device{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(map(str, missing))} that other metrics report")


def fill_snapshot(snapshot: LibtpuSnapshot, metrics: Mapping[str, pb.TPUMetric]) -> None:
    """Decode the metrics read from one address into its snapshot (devices, latencies, notes)."""
    reader = _Reader(metrics)
    used, _ = reader.gauges(names.HBM_USAGE, nonnegative=True)
    total, _ = reader.gauges(names.HBM_TOTAL, nonnegative=True)
    bandwidth, _ = reader.gauges(names.HBM_UTILIZATION, percent=True)
    idle, _ = reader.gauges(names.TENSORCORE_IDLE, nonnegative=True)
    queue = reader.per_device_sums(names.HLO_QUEUE_SIZE)
    timing = reader.per_device_histograms(names.HLO_EXECUTION_TIMING)

    per_device = {names.HBM_USAGE: set(used), names.HBM_TOTAL: set(total), names.HBM_UTILIZATION: set(bandwidth),
                  names.TENSORCORE_IDLE: set(idle), names.HLO_QUEUE_SIZE: set(queue),
                  names.HLO_EXECUTION_TIMING: set(timing)}
    _note_mismatched_ids(reader, per_device)
    figures = {device: DeviceFigures(device) for device in sorted(set().union(*per_device.values()))}
    for device, value in used.items():
        figures[device].hbm_used_bytes = int(value)
    for device, value in total.items():
        figures[device].hbm_total_bytes = int(value)
    for device, value in bandwidth.items():
        figures[device].hbm_bandwidth_utilization_percent = value
    for device, value in idle.items():
        figures[device].tensorcore_idle_duration_s = value
    for device, count in queue.items():
        figures[device].hlo_queue_size = count
    for device, summary in timing.items():
        figures[device].hlo_execution_time_us = summary
    # Per-chip duty cycles are spread over the devices the HBM metrics name (the runtime's own devices).
    base = sorted(set(used) | set(total)) or sorted(figures)
    snapshot.duty_cycle_scope = _assign_duty_cycle(reader, figures, base)

    snapshot.devices = [figures[d] for d in sorted(figures)]
    snapshot.transfer_latencies = [latency for name in sorted(metrics) if names.is_latency_distribution(name)
                                   for latency in reader.latencies(name)]
    snapshot.delivery_rates = [rate for name in sorted(metrics) if names.is_rate_distribution(name)
                               for rate in reader.rates(name)]
    empty = sorted(name for name, metric in metrics.items() if not metric.metrics)
    if empty:
        reader.notes.append(f"served with no data points: {', '.join(empty)}")
    snapshot.notes.extend(reader.notes)


# --- runtime status ---------------------------------------------------------------------------------

def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return "unknown"


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _hex(message: Any, name: str) -> str | None:
    value = _optional(message, name)
    return str(value.hex()) if value else None


def _core(key: int, state: pb.CoreState) -> CoreStatus:
    core_id = state.core_id
    on_chip = core_id.core_on_chip
    core = CoreStatus(
        global_core_id=core_id.global_core_id if core_id.HasField("global_core_id") else key,
        chip_id=_optional(core_id, "chip_id"),
        core_type=_enum_name(pb.CoreType, on_chip.type, "CORE_TYPE_") if on_chip.HasField("type") else "unknown",
        core_index=_optional(on_chip, "index"),
        error_message=state.error_message or None,
        program_fingerprint=_hex(state, "program_fingerprint"),
        launch_id=_optional(state, "launch_id"),
        xdb_server_running=_optional(state, "xdb_server_running"),
    )
    for sequencer in state.sequencer_info:
        kind = sequencer.sequencer_type
        core.sequencers.append(SequencerState(
            sequencer_type=_enum_name(pb.SequencerType, kind, "SEQUENCER_TYPE_")
            if sequencer.HasField("sequencer_type") else "unknown",
            **{name: _optional(sequencer, source) for name, source in (
                ("index", "sequencer_index"), ("pc", "pc"), ("tag", "tag"), ("tracemark", "tracemark"),
                ("program_id", "program_id"), ("run_id", "run_id"))},
            hlo_location=sequencer.hlo_location or None,
            hlo_detailed_info=sequencer.hlo_detailed_info or None,
        ))
    for queued in state.queued_program_info:
        core.queued_programs.append(QueuedProgram(run_id=_optional(queued, "run_id"),
                                                  launch_id=_optional(queued, "launch_id"),
                                                  program_fingerprint=_hex(queued, "program_fingerprint")))
    return core


def runtime_status(address: str, response: pb.GetTpuRuntimeStatusResponse) -> RuntimeStatus:
    """A `RuntimeStatus` of one service from its GetTpuRuntimeStatus response (cores sorted by their key)."""
    return RuntimeStatus(address=address,
                         host_name=response.host_name if response.HasField("host_name") else None,
                         cores=[_core(key, response.core_states[key]) for key in sorted(response.core_states)])
