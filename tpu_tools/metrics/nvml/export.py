"""Prometheus metric families of an NVML snapshot (the monitor's `nvml` group), named by Prometheus conventions.

Every GPU series carries the labels gpu (NVML's index), uuid, pci_bus_id and device (the devices group's
key, e.g. gpu:0, empty for a GPU it could not place), so that they join the `tpu_tools_device_*` series;
per-process series add pid and tag (the agent's tag, empty for a process without an agent). Ratios are 0..1,
counters end in _total. The memory in use, its total and the utilization are the devices group's figures
(`tpu_tools_device_memory_used_bytes`, `..._memory_total_bytes`, `..._utilization_ratio`), one name per figure
for every platform, and are not repeated here. The amdsmi group exports AMD GPUs under the same names with one
more label, vendor="amd".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.gpu import GpuRecord, GpusRecord

PREFIX = "tpu_tools_gpu_"
GPU_LABELS = ["gpu", "uuid", "pci_bus_id", "device"]

# (metric name, GpuRecord field, scale, documentation)
_GAUGES: list[tuple[str, str, float, str]] = [
    ("memory_reserved_bytes", "memory_reserved_bytes", 1, "GPU memory the driver reserves for itself."),
    ("memory_free_bytes", "memory_free_bytes", 1, "GPU memory free."),
    ("memory_utilization_ratio", "utilization_memory_percent", 0.01,
     "Share of the last sample period device memory was read or written."),
    ("temperature_celsius", "temperature_celsius", 1, "GPU core temperature."),
    ("power_draw_watts", "power_draw_watts", 1, "Power drawn by the board."),
    ("power_limit_watts", "power_limit_watts", 1, "Enforced power limit."),
    ("sm_clock_hertz", "clock_sm_hz", 1, "SM clock."),
    ("sm_clock_max_hertz", "clock_sm_max_hz", 1, "Highest SM clock."),
    ("memory_clock_hertz", "clock_memory_hz", 1, "Memory clock."),
    ("memory_clock_max_hertz", "clock_memory_max_hz", 1, "Highest memory clock."),
    ("performance_state", "performance_state", 1, "Performance state: 0 is P0, the highest."),
    ("ecc_volatile_uncorrected_errors", "ecc_volatile_uncorrected_errors", 1,
     "Uncorrected ECC errors since the driver was loaded."),
    ("remapped_rows_pending", "remapped_rows_pending", 1, "1 when a row remapping waits for a GPU reset."),
    ("remapped_rows_failed", "remapped_rows_failed", 1, "1 when a row remapping failed."),
    ("pcie_link_generation", "pcie_link_generation", 1, "Current PCIe link generation."),
    ("pcie_link_generation_max", "pcie_link_generation_max", 1, "Highest PCIe link generation of the link."),
    ("pcie_link_width", "pcie_link_width", 1, "Current PCIe link width (lanes)."),
    ("pcie_link_width_max", "pcie_link_width_max", 1, "Widest PCIe link width (lanes)."),
    ("pcie_tx_bytes_per_second", "pcie_tx_bytes_per_second", 1, "PCIe bytes sent per second (20 ms window)."),
    ("pcie_rx_bytes_per_second", "pcie_rx_bytes_per_second", 1, "PCIe bytes received per second (20 ms window)."),
    ("nvlink_links_active", "nvlink_links_active", 1, "NVLink links up."),
    ("nvlink_links", "nvlink_links", 1, "NVLink links of the board (up or not)."),
    ("fan_speed_ratio", "fan_speed_percent", 0.01, "Fan speed, from 0 to 1 of its maximum."),
    ("mig_enabled", "mig_enabled", 1, "1 when MIG mode is on."),
    ("persistence_mode", "persistence_mode", 1, "1 when persistence mode is on."),
]
_COUNTERS: list[tuple[str, str, str]] = [
    ("energy_joules", "energy_joules", "Energy used since the driver was loaded."),
    ("ecc_aggregate_uncorrected_errors", "ecc_aggregate_uncorrected_errors", "Uncorrected ECC errors, lifetime."),
    ("nvlink_tx_bytes", "nvlink_tx_bytes_total", "NVLink bytes sent, all links."),
    ("nvlink_rx_bytes", "nvlink_rx_bytes_total", "NVLink bytes received, all links."),
    ("pcie_replay_errors", "pcie_replay_errors", "PCIe replays (link-level retransmissions) since the driver "
                                                 "was loaded."),
    ("nvlink_replay_errors", "nvlink_replay_errors", "NVLink replay errors, all links."),
    ("nvlink_recovery_errors", "nvlink_recovery_errors", "NVLink recovery errors, all links."),
    ("nvlink_crc_errors", "nvlink_crc_errors", "NVLink CRC (flit) errors, all links."),
]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value) if isinstance(value, (int, float)) else None


def _add_figures(gpu: GpuRecord, labels: list[str], gauges: dict[str, GaugeMetricFamily],
                 counters: dict[str, CounterMetricFamily]) -> None:
    """The GPU's one-number figures, each into its gauge or counter."""
    for name, key, scale, _ in _GAUGES:
        value = _number(getattr(gpu, key))
        if value is not None:
            gauges[name].add_metric(labels, round(value * scale, 9))
    for name, key, _ in _COUNTERS:
        value = _number(getattr(gpu, key))
        if value is not None:
            counters[name].add_metric(labels, value)


def families(data: GpusRecord, vendor: str | None = None) -> Iterator[Metric]:
    """Families of the group's record (its GPUs, their processes with their agents' tags).

    vendor: the value of a `vendor` label on every series (None: no such label, NVML's series).
    """
    gpu_labels = [*GPU_LABELS, "vendor"] if vendor else GPU_LABELS
    gauges = {name: GaugeMetricFamily(PREFIX + name, doc, labels=gpu_labels) for name, _, _, doc in _GAUGES}
    counters = {name: CounterMetricFamily(PREFIX + name, doc, labels=gpu_labels) for name, _, doc in _COUNTERS}
    up = GaugeMetricFamily(PREFIX + "up", "1 when NVML answered for the GPU; 0 when it is lost or not answering.",
                           labels=[*gpu_labels, "status"])
    reasons = GaugeMetricFamily(PREFIX + "clock_event_reason", "1 for each active clock event (throttle) reason.",
                                labels=[*gpu_labels, "reason"])
    remapped = GaugeMetricFamily(PREFIX + "remapped_rows", "Rows remapped after memory errors.",
                                 labels=[*gpu_labels, "kind"])
    xid = CounterMetricFamily(PREFIX + "xid_errors", "XID error events, by code, since the exporter started.",
                              labels=[*gpu_labels, "code"])
    xid_last = GaugeMetricFamily(PREFIX + "xid_last_event_timestamp_seconds", "Time of the last XID event, with "
                                 "its code and what it means.", labels=[*gpu_labels, "code", "description"])
    mig_labels = [*gpu_labels, "gpu_instance", "compute_instance"]
    mig_used = GaugeMetricFamily(PREFIX + "mig_instance_memory_used_bytes", "Memory in use in a MIG instance.",
                                 labels=mig_labels)
    mig_total = GaugeMetricFamily(PREFIX + "mig_instance_memory_total_bytes", "Memory of a MIG instance.",
                                  labels=mig_labels)
    link_down = GaugeMetricFamily(PREFIX + "nvlink_link_down", "1 for each NVLink link of the board that is down.",
                                  labels=[*gpu_labels, "link"])
    process_memory = GaugeMetricFamily(PREFIX + "process_memory_used_bytes", "GPU memory a process holds.",
                                       labels=[*gpu_labels, "pid", "tag"])
    process_sm = GaugeMetricFamily(PREFIX + "process_sm_utilization_ratio", "A process's share of SM time (NVML's "
                                   "recent sample).", labels=[*gpu_labels, "pid", "tag"])
    for gpu in data.gpus:
        labels = [str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "", gpu.device_key or ""]
        labels += [vendor] if vendor else []
        up.add_metric([*labels, gpu.status], 1.0 if gpu.ok else 0.0)
        _add_figures(gpu, labels, gauges, counters)
        for code, count in (gpu.xid_errors or {}).items():
            xid.add_metric([*labels, code], float(count))
        if gpu.xid_last is not None:
            xid_last.add_metric([*labels, str(gpu.xid_last.code), gpu.xid_last.description or ""],
                                gpu.xid_last.time_unix_s)
        for instance in gpu.mig_instances or []:
            ids = [str(instance.gpu_instance_id), str(instance.compute_instance_id)]
            for family, value in ((mig_used, instance.memory_used_bytes), (mig_total, instance.memory_total_bytes)):
                if value is not None:
                    family.add_metric([*labels, *ids], float(value))
        for link in gpu.nvlink_links_down or []:
            link_down.add_metric([*labels, str(link)], 1.0)
        for reason in gpu.clock_event_reasons or []:
            reasons.add_metric([*labels, reason], 1.0)
        for kind, rows in (("correctable", gpu.remapped_rows_correctable),
                           ("uncorrectable", gpu.remapped_rows_uncorrectable)):
            if rows is not None:
                remapped.add_metric([*labels, kind], float(rows))
        for process in gpu.processes:
            process_labels = [*labels, str(process.pid), label_value(process.tag or "")]
            if process.gpu_memory_bytes is not None:
                process_memory.add_metric(process_labels, float(process.gpu_memory_bytes))
            if process.sm_utilization_percent is not None:
                process_sm.add_metric(process_labels, round(process.sm_utilization_percent / 100, 9))
    yield up
    yield from gauges.values()
    yield from counters.values()
    yield reasons
    yield remapped
    yield xid
    yield xid_last
    yield link_down
    yield mig_used
    yield mig_total
    yield process_memory
    yield process_sm
