"""Text views of the device inventory: the `tpu-ls` header and tables."""

from __future__ import annotations

from tpu_tools.accelerators import spec_for_device_kind
from tpu_tools.inventory import DeviceEntry, Inventory, ServiceFigures
from tpu_tools.metrics.chiphealth import ChipHealth, HostHealth, link_level, link_text, throttle_level, throttle_text
from tpu_tools.pjrt.discover import Chip, Holder
from tpu_tools.pjrt.placement import FreeChips, export_lines
from tpu_tools.pjrt.tpuvm import SliceInfo
from tpu_tools.render.libtpu_view import DUTY_HEADER, HBM_HEADER, duty_text, hbm_text
from tpu_tools.render.table import Column, TableData
from tpu_tools.shorten import shorten
from tpu_tools.units import MISSING, format_bytes, format_memory_pair

_COMMAND_WIDTH = 40


def header_line(inventory: Inventory) -> str:
    parts = [f"host {inventory.host}"]
    runtime = inventory.runtime
    if runtime is not None:
        parts.append(f"platform {runtime.platform} ({runtime.platform_version})")
        parts.append(f"jax {runtime.jax_version}, jaxlib {runtime.jaxlib_version}")
        plugins = ", ".join(f"{k} {v}" for k, v in inventory.versions.plugins.items())
        if plugins:
            parts.append(plugins)
        parts.append(f"process {runtime.process_index + 1} of {runtime.process_count}")
        parts.append(f"{runtime.local_device_count} local of {runtime.device_count} devices")
    else:
        parts.append(f"runtime {inventory.runtime_status}")
        parts.append(f"jax {inventory.versions.jax or 'not installed'}, jaxlib {inventory.versions.jaxlib or '-'}")
        parts.append(f"{len(inventory.discovery.chips)} accelerator chips found")
    slice_text = slice_summary(inventory.tpu_slice)
    if slice_text:
        parts.append(slice_text)
    return "  ".join(parts)


def slice_summary(info: SliceInfo) -> str:
    """"slice v5litepod-16 (my-tpu), worker 1 of 4" where the host is a worker of a TPU slice."""
    if not info.known:
        return ""
    name = info.slice_label
    text = f"slice {info.accelerator_type or '?'}"
    if name and name != info.accelerator_type:
        text += f" ({name})"
    if info.worker_id is not None:
        text += f", worker {info.worker_id}"
        if info.worker_hostnames:
            text += f" of {len(info.worker_hostnames)}"
    return text


def holders_text(holders: list[Holder]) -> str:
    if not holders:
        return MISSING
    # the frontend its agent named goes before the command, as in tpu-top: "4242 [torch_xla] python train.py"
    return ", ".join(f"{h.pid} " + (f"[{h.frontend}] " if h.frontend else "") + _short_command(h.command)
                     for h in holders)


def _short_command(command: str) -> str:
    words = command.split()
    if not words:
        return "?"
    words[0] = words[0].rsplit("/", 1)[-1]
    text = " ".join(words)
    return shorten(text, _COMMAND_WIDTH)


def _per_chip(entry: DeviceEntry) -> str:
    chip = entry.chip
    spec = spec_for_device_kind(entry.device.device_kind)
    devices = (chip.devices_per_chip if chip else None) or (spec.devices_per_chip if spec else None)
    cores = (chip.cores_per_chip if chip else None) or (spec.cores_per_chip if spec else None)
    parts = []
    if chip is not None:
        parts.append(f"chip {chip.index}")
    if devices:
        parts.append(f"{devices} dev/chip")
    if cores:
        parts.append(f"{cores} cores")
    return ", ".join(parts) or MISSING


def _memory(entry: DeviceEntry) -> str:
    device = entry.device
    total = device.memory_limit_bytes
    if total is None:
        spec = spec_for_device_kind(device.device_kind)
        total = spec.hbm_bytes // (spec.devices_per_chip or 1) if spec and spec.hbm_bytes else None
    return format_memory_pair(device.memory_used_bytes, total)


def _probe(entry: DeviceEntry) -> str:
    probe = entry.probe
    if probe is None:
        return "not run"
    if not probe.ok:
        return f"FAIL {probe.error}"
    return f"pass {probe.compile_ms:.1f} ms / {probe.execute_us:.0f} us"


_SERVICE_COLUMNS = [Column(DUTY_HEADER, "right"), Column(HBM_HEADER, "right")]


def _service_cells(figures: ServiceFigures | None) -> list[str]:
    """The running job's duty cycle and HBM, from libtpu's metrics service."""
    if figures is None:
        return [MISSING, MISSING]
    usage = figures.usage
    return [duty_text(usage.duty_cycle_percent), hbm_text(usage.hbm_used_bytes, usage.hbm_total_bytes)]


_HEALTH_COLUMNS = [Column("THROTTLE", "right"), Column("ICI LINKS", no_wrap=True)]


_LEVEL_STYLES = {"error": "bold red", "warn": "yellow"}


def _chip_health(health: HostHealth | None, chip: Chip | None) -> ChipHealth | None:
    return health.chips.get(chip.index) if health is not None and chip is not None else None


def _health_cells(figures: ChipHealth | None) -> list[str]:
    """A job-held chip's throttle score and worst ICI link, as the job's agent read them."""
    return [throttle_text(figures), link_text(figures)]


def _style_health(table: TableData, first: int, figures: ChipHealth | None) -> None:
    """On a terminal, an unusable link in the error style, a link with a problem and heavy throttling in the
    warning style."""
    for column, level in ((first, throttle_level(figures)), (first + 1, link_level(figures))):
        if level in _LEVEL_STYLES:
            table.style_last(column, _LEVEL_STYLES[level])


def device_table(inventory: Inventory) -> TableData:
    columns = [Column("ID", "right"), Column("KIND"), Column("PLATFORM"), Column("CHIP"),
               Column("MEMORY USED / TOTAL", "right"), Column("PCI"), Column("NUMA", "right")]
    service = any(entry.libtpu for entry in inventory.devices)
    if service:
        columns.extend(_SERVICE_COLUMNS)
    health = inventory.tpu_health  # (--force: the runtime's devices on chips a job with the agent holds)
    if health is None or not any(e.chip and e.chip.index in health.chips for e in inventory.devices):
        health = None
    if health:
        columns.extend(_HEALTH_COLUMNS)
    if inventory.probed:
        columns.append(Column("HEALTH (compile / execute)"))
    columns.append(Column("PROCESSES", max_width=_COMMAND_WIDTH + 8))
    table = TableData(columns)
    for entry in inventory.devices:
        device, chip = entry.device, entry.chip
        cells = [device.id, device.device_kind, device.platform, _per_chip(entry), _memory(entry),
                 chip.pci_address if chip else MISSING,
                 chip.numa_node if chip and chip.numa_node is not None else MISSING]
        if service:
            cells.extend(_service_cells(entry.libtpu))
        figures = _chip_health(health, chip)
        first = len(cells)
        if health:
            cells.extend(_health_cells(figures))
        if inventory.probed:
            cells.append(_probe(entry))
        cells.append(holders_text(entry.holders))
        table.add_row(*cells)
        if health:
            _style_health(table, first, figures)
    return table


def chip_table(chips: list[Chip], libtpu: dict[int, ServiceFigures] | None = None,
               health: HostHealth | None = None) -> TableData:
    """Passive view: one row per chip, for when the runtime is not opened (with the service's figures, and the
    throttle score and ICI links the holding job's agent read, if any)."""
    # With the service's figures, its HBM used / total replaces the chip's published total.
    memory = _SERVICE_COLUMNS if libtpu else [Column("MEMORY TOTAL", "right")]
    health = health if health is not None and health.chips else None
    table = TableData([Column("CHIP", "right"), Column("KIND"), Column("PLATFORM"), Column("PER CHIP"), *memory,
                       *(_HEALTH_COLUMNS if health else []), Column("PCI"), Column("NUMA", "right"), Column("NODES"),
                       Column("PROCESSES", max_width=_COMMAND_WIDTH + 8)])
    for chip in chips:
        per_chip = ", ".join(filter(None, [
            f"{chip.devices_per_chip} dev" if chip.devices_per_chip else "",
            f"{chip.cores_per_chip} cores" if chip.cores_per_chip else "",
        ])) or MISSING
        nodes = " ".join(n.path + ("" if n.exists else " (missing)") for n in chip.device_nodes) or MISSING
        numa = MISSING if chip.numa_node is None else chip.numa_node
        figures = _service_cells(libtpu.get(chip.index)) if libtpu else [format_bytes(chip.hbm_bytes)]
        health_figures = _chip_health(health, chip)
        cells = _health_cells(health_figures) if health else []
        table.add_row(chip.index, chip.name, chip.platform, per_chip, *figures, *cells, chip.pci_address, numa, nodes,
                      holders_text(chip.holders))
        if health:
            _style_health(table, 4 + len(figures), health_figures)
    return table



def free_chip_lines(placements: list[FreeChips]) -> list[str]:
    """`tpu-ls --free`: per platform, the held and free chips, then the environment for a new job."""
    if not placements:
        return ["no accelerator found"]
    lines: list[str] = []
    for placement in placements:
        if lines:
            lines.append("")
        free = ",".join(map(str, placement.free)) or "none"
        lines.append(f"{placement.platform}: {len(placement.chip_indexes)} chips, {len(placement.held)} held, "
                     f"free: {free}")
        for index, holders in sorted(placement.held.items()):
            lines.append(f"  chip {index} held by {holders_text(holders)}")
        if placement.environment:
            lines.append(f"pin a new job to chip{'s' if len(placement.chosen) > 1 else ''} "
                         f"{','.join(map(str, placement.chosen))}:")
            lines += [f"  {line}" for line in export_lines([placement], export=False)]
        lines += [f"note: {note}" for note in placement.notes]
    return lines
