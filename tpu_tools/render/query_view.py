"""`tpu-ls --query FIELD,...`: chosen figures of every device, one row each, as CSV (or JSON objects).

The rows are the inventory's device summaries; the field names are stable (scripts and dashboards read them),
in the project's units-in-the-name style. An unknown value is an empty cell (null in JSON).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_tools.inventory import DeviceSummary
from tpu_tools.sanitize import safe_text


@dataclass(frozen=True)
class QueryField:
    name: str
    help: str
    value: Callable[[DeviceSummary], Any]


def _free(summary: DeviceSummary) -> int | None:
    if summary.memory_total_bytes is None or summary.memory_used_bytes is None:
        return None
    return summary.memory_total_bytes - summary.memory_used_bytes


FIELDS: dict[str, QueryField] = {field.name: field for field in (
    QueryField("index", "the device's row in the listing (0, 1, ...)", lambda s: s.index),
    QueryField("platform", "PJRT platform: tpu, cuda, rocm, cpu", lambda s: s.platform),
    QueryField("name", "device kind or chip name (TPU v5e, NVIDIA H100 80GB HBM3, cpu)", lambda s: s.name),
    QueryField("device_id", "PJRT device id (empty when the runtime was not opened)", lambda s: s.device_id),
    QueryField("chip_index", "the chip's index on this host (PCI order)", lambda s: s.chip_index),
    QueryField("pci_address", "PCI address of the chip", lambda s: s.pci_address),
    QueryField("numa_node", "NUMA node of the chip", lambda s: s.numa_node),
    QueryField("memory_total_bytes", "device memory: the driver's, libtpu's service's, else PJRT's limit",
               lambda s: s.memory_total_bytes),
    QueryField("memory_used_bytes", "device memory in use, from the same source", lambda s: s.memory_used_bytes),
    QueryField("memory_free_bytes", "total less used", _free),
    QueryField("utilization_percent", "a GPU's utilization, a TPU's duty cycle (libtpu's service)",
               lambda s: s.utilization_percent),
    QueryField("temperature_celsius", "GPU temperature (the driver's)", lambda s: s.temperature_celsius),
    QueryField("power_draw_watts", "GPU power draw (the driver's)", lambda s: s.power_draw_watts),
    QueryField("holder_count", "processes holding the device", lambda s: len(s.holders)),
    QueryField("holder_pids", "their process ids, separated by ';'", lambda s: ";".join(str(h.pid) for h in s.holders)),
    QueryField("holder_commands", "their commands, separated by ';'",
               lambda s: ";".join(h.command for h in s.holders)),
)}
DEFAULT_FIELDS = ("index", "platform", "name", "chip_index", "pci_address", "memory_used_bytes",
                  "memory_total_bytes", "utilization_percent", "holder_pids")


def parse_fields(text: str) -> tuple[str, ...]:
    """"a,b" -> ("a", "b"). Raises ValueError naming an unknown field."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError("--query needs at least one field (--help-query lists them)")
    unknown = [name for name in names if name not in FIELDS]
    if unknown:
        raise ValueError(f"unknown --query field {unknown[0]!r} (--help-query lists them)")
    return names


def rows(summaries: Sequence[DeviceSummary], names: Sequence[str]) -> list[dict[str, Any]]:
    return [{name: FIELDS[name].value(summary) for name in names} for summary in summaries]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return safe_text(str(value))


def csv_text(summaries: Sequence[DeviceSummary], names: Sequence[str]) -> str:
    """A header line of the field names, then one line per device."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for row in rows(summaries, names):
        writer.writerow([_cell(row[name]) for name in names])
    return buffer.getvalue()


def help_lines() -> list[str]:
    width = max(len(name) for name in FIELDS)
    return [f"{name:<{width}}  {field.help}" for name, field in FIELDS.items()]
