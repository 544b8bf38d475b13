"""`tpu-ls`: the accelerators on this host, who holds them, and whether they work."""

from __future__ import annotations

import click

from tpu_tools.cli.common import ToolCommand, common_options, output_options, run_cli, runtime_options
from tpu_tools.cli.output import Output, note
from tpu_tools.errors import EXIT_FAILURE, EXIT_OK, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Lists the accelerator devices of this host. Passive discovery reads sysfs, /dev and /proc without "
        "opening any device: PCI functions of TPUs (by vendor, device and subsystem id), NVIDIA and AMD GPUs, "
        "their device nodes, PCI address, NUMA node and CPU affinity, and every process holding a device node. "
        "Unless --no-runtime is given, the PJRT runtime is then queried in a separate child process with a "
        "time limit, for device ids, kinds, coordinates and memory.\n"
        "A TPU can be owned by one process only. When another process holds a TPU chip (its device node or "
        "libtpu's lock file), tpu-ls does not open the runtime: it lists the chips from passive discovery with "
        "their holders, says why runtime details are missing, and exits 0. --force opens it anyway.\n"
        "With no accelerator, tpu-ls lists the CPU platform's devices (--host-devices N makes it expose N)."
    ),
    "JSON OUTPUT": (
        "--json prints one document, schema \"tpu-tools/ls/v1\". Keys are stable; numbers are bytes or the "
        "unit in the key name; unknown values are null.\n"
        "schema, host, time (UTC, ISO 8601), requested_platform, runtime_status (ok, skipped, held).\n"
        "runtime: null, or {platform, platform_version, process_index, process_count, device_count, "
        "local_device_count, jax_version, jaxlib_version}.\n"
        "versions: {tpu_tools, jax, jaxlib, plugins: {distribution: version}}.\n"
        "devices[]: {id, local_hardware_id, platform, device_kind, process_index, host, coords, core_on_chip, "
        "memory_limit_bytes, memory_used_bytes, memory_peak_bytes, chip_index, devices_per_chip, "
        "cores_per_chip, pci_address, numa_node, holders[], probe}. probe is null or "
        "{device_id, ok, compile_ms, execute_us, error}.\n"
        "chips[]: {index, name, vendor, platform, pci_address, pci_functions[], numa_node, cpu_affinity, "
        "iommu_group, devices_per_chip, cores_per_chip, hbm_bytes, device_nodes[], holders[]}; "
        "device_nodes[]: {path, exists, mode, uid, gid, holders[]}; holders[]: {pid, user, command}.\n"
        "notes[]: sentences about what could not be read or done."
    ),
    "TOPOLOGY": (
        "--topology draws the chips by their coordinates: one grid for a 2-D slice, one grid per z layer for "
        "3-D. Cells show the device ids of a chip; '-' and '|' join neighbours. A dimension that wraps "
        "around (a torus) is marked with '~': 3-D tori (v4, v5p, 7x) on extents that are multiples of 4, "
        "2-D chips (v5e, v6e) on a full side of 16. Platforms without coordinates get a plain list."
    ),
    "EXAMPLES": (
        "tpu-ls\n"
        "tpu-ls --host-devices 8 --json\n"
        "tpu-ls --probe --platform tpu\n"
        "tpu-ls --no-runtime"
    ),
}


@click.command(name="ls", cls=ToolCommand, man_sections=MAN_SECTIONS,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--probe", is_flag=True,
              help="Compile and run a small program on every device, verify it, time it; exit 1 on a failure.")
@click.option("--topology", is_flag=True, help="Draw the device mesh from TPU coordinates.")
@click.option("--no-runtime", is_flag=True, help="Passive discovery only: never start a runtime (fast).")
@click.option("--force", is_flag=True, help="Open the runtime even when another process holds a TPU.")
@runtime_options
@output_options
@common_options
def ls_command(probe: bool, topology: bool, no_runtime: bool, force: bool, policy: RuntimePolicy,
               timeout_s: float, out: Output) -> int:
    """List accelerator devices, their memory, PCI placement and the processes using them."""
    if no_runtime and (probe or force):
        raise UsageError("--no-runtime cannot be combined with --probe or --force")
    from tpu_tools.inventory import RUNTIME_OK, build_inventory

    inventory = build_inventory(policy, timeout_s=timeout_s, probe=probe, use_runtime=not no_runtime,
                                force=force)
    if out.is_json:
        out.json(inventory.to_dict())
    else:
        _render(inventory, topology, out)
    if probe and inventory.runtime_status != RUNTIME_OK:
        note("probe not run: " + "; ".join(inventory.notes))
    return EXIT_FAILURE if inventory.probe_failed else EXIT_OK


def _render(inventory, topology: bool, out: Output) -> None:
    from tpu_tools.render.inventory_view import chip_table, device_table, header_line

    out.text(header_line(inventory))
    if inventory.devices:
        out.table(device_table(inventory))
    elif inventory.discovery.chips:
        out.table(chip_table(inventory.discovery.chips))
    else:
        out.text("no accelerator found")
    if topology:
        from tpu_tools.render.topology import draw_topology

        out.text("")
        out.text(draw_topology([e.device for e in inventory.devices]) if inventory.devices
                 else "topology needs the runtime (device coordinates come from PJRT)")
    for line in [*inventory.discovery.notes, *inventory.notes]:
        out.text(f"note: {line}")


def main() -> None:
    run_cli(ls_command)
