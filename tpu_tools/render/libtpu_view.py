"""Text views of what libtpu's metrics service reports: figure cells, a per-device table, runtime status."""

from __future__ import annotations

from tpu_tools.metrics.libtpu import NO_SAMPLES, NOT_SERVED, DistributionSummary, LibtpuSnapshot, RuntimeStatus
from tpu_tools.render.table import Column, TableData
from tpu_tools.units import MISSING, format_duration_us, format_memory_pair, format_percent

DUTY_HEADER = "DUTY CYCLE"
HBM_HEADER = "HBM USED / TOTAL"


def duty_text(value: float | None) -> str:
    return format_percent(value)


def hbm_text(used: int | None, total: int | None) -> str:
    return format_memory_pair(used, total)


def latency_text(summary: DistributionSummary | None, percentiles: tuple[str, ...] = ("p50", "p99")) -> str:
    """"2.41 ms / 2.88 ms" for p50 / p99; "no samples" for an empty distribution."""
    if summary is None:
        return MISSING
    if not summary.has_samples:
        return NO_SAMPLES
    return " / ".join(format_duration_us(summary.percentile(p)) for p in percentiles)


def _served(snapshot: LibtpuSnapshot, figure: str, text: str) -> str:
    return text if snapshot.serves_field(figure) else NOT_SERVED


def service_device_table(snapshots: list[LibtpuSnapshot]) -> TableData:
    """Every device of every answering service, as the service numbers them."""
    table = TableData([Column("SERVICE"), Column("DEVICE", "right"), Column(DUTY_HEADER, "right"),
                       Column(HBM_HEADER, "right"), Column("HLO QUEUE", "right"),
                       Column("HLO TIME p50 / p99", "right")], title="libtpu metrics service")
    for snapshot in snapshots:
        if not snapshot.ok:
            continue
        for device in snapshot.devices:
            table.add_row(snapshot.address, device.device_id,
                          _served(snapshot, "duty_cycle_percent", duty_text(device.duty_cycle_percent)),
                          hbm_text(device.hbm_used_bytes, device.hbm_total_bytes),
                          _served(snapshot, "hlo_queue_size",
                                  MISSING if device.hlo_queue_size is None else str(device.hlo_queue_size)),
                          _served(snapshot, "hlo_execution_time_us", latency_text(device.hlo_execution_time_us)))
    return table


def runtime_status_views(statuses: list[RuntimeStatus]) -> list[TableData | str]:
    """A table per answering address, a line per address that does not serve the status; if none answered,
    one line saying so."""
    views: list[TableData | str] = []
    for status in statuses:
        if status.error is not None:
            continue
        if not status.served:
            views.append(f"libtpu runtime status at {status.address}: {NOT_SERVED}")
            continue
        title = f"libtpu runtime status at {status.address}" + (f", host {status.host_name}" if status.host_name
                                                                 else "")
        table = TableData([Column("CORE", "right"), Column("CHIP", "right"), Column("TYPE"), Column("STATE"),
                           Column("PROGRAM", "right"), Column("RUN", "right"), Column("PC", "right"),
                           Column("QUEUED", "right"), Column("ERROR / HLO LOCATION", max_width=60)], title=title)
        for core in status.cores:
            current = core.current
            kind = core.core_type.replace("_", " ") + ("" if core.core_index is None else f" {core.core_index}")
            table.add_row(core.global_core_id, MISSING if core.chip_id is None else core.chip_id, kind, core.state,
                          _number(current.program_id if current else None),
                          _number(current.run_id if current else None),
                          MISSING if current is None or current.pc is None else f"0x{current.pc:x}",
                          len(core.queued_programs),
                          core.error_message or (current.hlo_location if current and current.hlo_location else MISSING))
        if not status.cores:
            table.add_row(*[MISSING] * len(table.columns))
        views.append(table)
    if not views:
        tried = ", ".join(s.address for s in statuses)
        views.append(f"libtpu runtime status: no metrics service answered (tried {tried})")
    return views


def _number(value: int | None) -> str:
    return MISSING if value is None else str(value)
