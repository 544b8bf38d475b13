"""`tpu-ls`: the accelerators on this host, who holds them, and whether they work."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from tpu_tools.cli.common import (
    ToolCommand,
    common_options,
    is_debug,
    metrics_options,
    run_cli,
    runtime_options,
)
from tpu_tools.cli.output import FORMAT_CHOICES, Output, note, resolve_format
from tpu_tools.errors import EXIT_FAILURE, EXIT_OK, RuntimeFailure, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy

if TYPE_CHECKING:  # imported when needed: tpu-ls starts fast
    from tpu_tools.inventory import Inventory

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
        "With no accelerator, tpu-ls lists the CPU platform's devices (--host-devices N makes it expose N).\n"
        "NVIDIA GPUs are read through NVML (the driver's libnvidia-ml.so.1, as nvidia-smi reads them): per GPU the "
        "card's memory used / total, utilization, temperature, power and every process with a context on it and "
        "the GPU memory it holds; a PID that /proc does not show lives in another PID namespace (a container). "
        "NVML's GPUs are tied to the PCI functions of passive discovery by bus id. When NVML lists the GPUs, the "
        "PJRT runtime is not started (it would create a CUDA context on every GPU): --probe, --force or a "
        "--platform that is not a GPU platform start it, and JAX's view (device ids, XLA's memory pool) is then "
        "listed below. A field the driver does not support shows '-'; a GPU that NVML reports lost, or whose "
        "NVML calls do not return within --timeout, is listed as such and the others are shown (exit 0). Without "
        "NVML (no driver), tpu-ls works as before and --debug says why in one line. TPU_TOOLS_NVML=0 turns NVML "
        "reading off.\n"
        "AMD GPUs are read the same way through AMD's amdsmi bindings (the tpu-tools[amd] extra, which loads "
        "ROCm's libamd_smi.so), in a table of their own with the same columns; TPU_TOOLS_AMDSMI=0 turns it off.\n"
        "The running job's figures come from libtpu's runtime metrics service, which a process with libtpu "
        "loaded serves over gRPC (localhost:8431, every port in TPU_RUNTIME_METRICS_PORTS, and each "
        "--metrics-addr). Reading it never opens the TPU, so it works while a job holds the chips: when a service "
        "answers, a DUTY CYCLE column and HBM USED / TOTAL figures are added, per chip when the TPU is held. "
        "Service devices are paired with chips (or runtime devices) in order when the counts agree; otherwise "
        "the service's devices are listed in a table of their own. When no service answers, tpu-ls carries on "
        "without those columns (--debug says why in one line on stderr). --runtime-status adds libtpu's per-core "
        "state: program, run, program counter, queued programs, HLO location and error messages.\n"
        "TPU health: a process that holds TPU chips and runs the tpu-tools agent has read, through libtpu's SDK "
        "inside the job, each chip's throttle score (0 .. 10, 10 % of throttling a step) and the health of its ICI "
        "links (0 healthy, 1-5 transient, 6-9 persistent problem, 10 unusable). tpu-ls asks the agents of the "
        "holders over their sockets (never the TPU), each within --timeout and at most 2 s, and adds a THROTTLE "
        "column (the chip's most throttled device) and an ICI LINKS column: 'ok', or the worst link that is not "
        "healthy ('ICI 10 tray1.chip3.ici0', '+N' more). The job's devices pair with the chips it holds in order "
        "when the counts agree; a link pairs with the host's TPU chip its location names (chipN, PCI order). What "
        "does not pair, values in no documented format and an agent that does not answer are notes, never health."
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
        "iommu_group, devices_per_chip, cores_per_chip, hbm_bytes, device_nodes[], holders[], libtpu, tpu_health}; "
        "device_nodes[]: {path, exists, mode, uid, gid, holders[]}; holders[]: {pid, user, command, frontend}; "
        "frontend is jax or torch_xla (the library that runs the holder's programs, as its agent says: TPU holders' "
        "agents are asked) or null (no agent answered, or none loaded yet).\n"
        "notes[]: sentences about what could not be read or done.\n"
        "Added with the libtpu metrics service (same schema; null when no service figure pairs): "
        "devices[].libtpu and chips[].libtpu: null or {address, device_ids[], hbm_used_bytes, hbm_total_bytes, "
        "duty_cycle_percent} (bytes summed and duty cycle averaged over the chip's devices).\n"
        "Added with the agents of the processes holding TPU chips: chips[].tpu_health: null (no agent of a holder "
        "read it) or {pid, tag, throttle_score (0-10, the chip's most throttled device; null when its devices did "
        "not pair), throttled_percent, devices[], worst_link_score, ici_links[]}; devices[]: {device, score, "
        "throttled_percent}; ici_links[]: {location (as libtpu names it, e.g. tray1.chip3.ici0.int), tray, chip, "
        "port, kind, score (0 healthy .. 10 unusable), state (healthy, transient problem, persistent problem, "
        "unusable)}.\n"
        "tpu_health: null (not asked) or one per holder whose agent was asked: {pid, tag, chip_indexes[], error "
        "(null, or why the agent did not answer), frontend, sdk_status, read (whether it read TPU health), "
        "ici_links[], "
        "throttle[] (devices[] as above, every one the job read, paired or not), problems[] (values in no "
        "documented format: never shown as health)}.\n"
        "libtpu_metrics[]: one per address asked: {address, error, elapsed_ms, served_metrics[], "
        "not_served_metrics[], unread_metrics[], duty_cycle_scope (device, chip or null), devices[], "
        "transfer_latencies[], notes[]}; error is null or the sentence saying why the address did not answer. "
        "devices[]: {device_id, hbm_used_bytes, hbm_total_bytes, duty_cycle_percent, "
        "hbm_bandwidth_utilization_percent, tensorcore_idle_duration_s, hlo_queue_size, hlo_execution_time_us}; "
        "transfer_latencies[]: {metric, name, buffer_size, latency_us}; hlo_execution_time_us and latency_us are "
        "null or {count, mean, min, max, p50, p90, p99, p999}, all but count null when there are no samples. "
        "A figure whose metric is in not_served_metrics is null: not served by this runtime.\n"
        "nvml: null (no GPU in discovery) or {available, error, driver_version, nvml_version, cuda_driver_version, "
        "elapsed_ms, gpus[]}; gpus[]: {index, status (ok, lost, not_answering, error), error, name, uuid, "
        "serial, pci_bus_id, minor_number, chip_index, numa_node, memory_total_bytes, memory_used_bytes, "
        "memory_reserved_bytes, memory_free_bytes, memory_info_version, utilization_gpu_percent, "
        "utilization_memory_percent, temperature_celsius, temperature_hotspot_celsius, temperature_memory_celsius, "
        "power_draw_watts, power_limit_watts, energy_joules, "
        "clock_sm_hz, clock_sm_max_hz, clock_memory_hz, clock_memory_max_hz, performance_state, "
        "clock_event_reasons_mask, clock_event_reasons[], ecc_enabled, ecc_volatile_uncorrected_errors, "
        "ecc_aggregate_uncorrected_errors, remapped_rows_correctable, remapped_rows_uncorrectable, "
        "remapped_rows_pending, remapped_rows_failed, pcie_link_generation, pcie_link_generation_max, "
        "pcie_link_width, pcie_link_width_max, pcie_tx_bytes_per_second, pcie_rx_bytes_per_second, mig_enabled, "
        "persistence_mode, compute_mode, nvlink_links, nvlink_links_active, nvlink_tx_bytes_total, "
        "nvlink_rx_bytes_total, processes[], unsupported {field: reason}}; processes[]: {pid, kind, "
        "gpu_memory_bytes, sm_utilization_percent, memory_utilization_percent, visible, user, command}.\n"
        "amdsmi: null (no AMD GPU in discovery) or {available, error, source (amdsmi), driver_version, "
        "bindings_version, elapsed_ms, gpus[]}, gpus[] as nvml's, the fields amdsmi lacks null.\n"
        "libtpu_runtime_status: null without --runtime-status, else one per address: {address, error, served, "
        "host_name, cores[]}; served is false when the runtime has no status rpc. cores[]: {global_core_id, "
        "chip_id, core_type, core_index, state (ok or error), error_message, program_fingerprint, launch_id, "
        "xdb_server_running, sequencers[], queued_programs[]}; sequencers[]: {sequencer_type, index, pc, tag, "
        "tracemark, program_id, run_id, hlo_location, hlo_detailed_info}; queued_programs[]: {run_id, launch_id, "
        "program_fingerprint}."
    ),
    "TOPOLOGY": (
        "--topology draws the chips by their coordinates: one grid for a 2-D slice, one grid per z layer for "
        "3-D. Cells show the device ids of a chip; '-' and '|' join neighbours. A dimension that wraps "
        "around (a torus) is marked with '~': 3-D tori (v4, v5p, 7x) on extents that are multiples of 4, "
        "2-D chips (v5e, v6e) on a full side of 16. Platforms without coordinates get a plain list."
    ),
    "QUERY": (
        "--query FIELD,... prints the chosen figures of every device, one row each, as CSV: a header line of the "
        "field names, then one line per device (like nvidia-smi --query-gpu=... --format=csv); --json prints them "
        "as a list of objects instead. --format csv without --query prints the default fields. --help-query lists "
        "the fields. The rows are the runtime's devices when it was opened, else the chips passive discovery found "
        "(a GPU host whose driver lists the GPUs: one row per GPU). An unknown value is an empty cell. Memory and "
        "utilization come from the GPU's driver, libtpu's metrics service, else PJRT's allocator in tpu-ls's own "
        "runtime child; holders are the processes with the device open, ';' between them."
    ),
    "FREE CHIPS": (
        "--free lists, per platform, the chips no process holds and the environment that pins a new job to them, "
        "without opening any device. On a TPU host: TPU_VISIBLE_CHIPS (the chips' host indexes), "
        "TPU_CHIPS_PER_PROCESS_BOUNDS (the block they form, x,y,z) and TPU_PROCESS_BOUNDS (1,1,1: one process). "
        "The chips must form a block the runtime accepts: TPU hosts lay their chips out two wide (chip i at "
        "i % 2, i // 2), and the blocks are one chip, a row of two, or whole rows aligned to their height "
        "(2x2 of chips 0-3 or 4-7, 2x4 of all eight); the largest block of free chips is chosen. On NVIDIA GPUs: "
        "CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID (indexes in PCI order); on AMD GPUs "
        "HIP_VISIBLE_DEVICES. --env prints only the NAME=value lines (env $(tpu-ls --env) python train.py), "
        "--export only export lines (eval \"$(tpu-ls --export)\"); both exit 1 with one sentence when no chip "
        "is free. --json: {schema \"tpu-tools/ls-free/v1\", host, time, platforms[] {platform, chips[], held[] "
        "{chip_index, holders[]}, free[], chosen[], environment {NAME: value}, notes[]}, notes[]}."
    ),
    "EXAMPLES": (
        "tpu-ls\n"
        "tpu-ls --query index,name,memory_used_bytes,utilization_percent,holder_pids\n"
        "tpu-ls --free\n"
        "eval \"$(tpu-ls --export)\" && python train.py\n"
        "tpu-ls --host-devices 8 --json\n"
        "tpu-ls --probe --platform tpu\n"
        "tpu-ls --no-runtime\n"
        "tpu-ls --metrics-addr localhost:8432 --runtime-status"
    ),
}


@click.command(name="ls", cls=ToolCommand, man_sections=MAN_SECTIONS, json_schema="tpu-tools/ls/v1")
@click.option("--probe", is_flag=True,
              help="Compile and run a small program on every device, verify it, time it; exit 1 on a failure.")
@click.option("--topology", is_flag=True, help="Draw the device mesh from TPU coordinates.")
@click.option("--verbose", "-v", is_flag=True,
              help="Also a GPU health table: PCIe link (generation and width, current and maximum, replays), "
                   "NVLink links up and errors, fan, MIG mode, ECC and remapped rows.")
@click.option("--no-runtime", is_flag=True, help="Passive discovery only: never start a runtime (fast).")
@click.option("--force", is_flag=True,
              help="Open the runtime even when another process holds a TPU, or when NVML already lists the GPUs.")
@click.option("--runtime-status", is_flag=True,
              help="Also show libtpu's per-core runtime state and error messages (from its metrics service).")
@click.option("--metric", "metric_names", multiple=True, metavar="NAME",
              help="Show one metric (repeatable) from whichever source serves it: tpu-info's names "
                   "(hbm_usage, duty_cycle_percent, tensorcore_utilization, buffer_transfer_latency, "
                   "hlo_exec_timing, core_state, ...), libtpu's own, ici_link_health and tpu_throttle_score "
                   "(read by the agents of the jobs that hold the chips), or an Orbax / Grain family; then exit.")
@click.option("--list-metrics", is_flag=True,
              help="List the metrics every libtpu metrics service and agent serves, what tpu-tools reads of "
                   "them, and what it knows that the runtime does not serve; then exit.")
@click.option("--query", "query_text", metavar="FIELD,...",
              help="Print these fields of every device, one row each, as CSV with a header (--help-query lists "
                   "them; --json: a list of objects).")
@click.option("--help-query", is_flag=True, help="List the fields --query takes, then exit.")
@click.option("--free", is_flag=True,
              help="Which chips no process holds, and the environment that pins a new job to them.")
@click.option("--env", "env_lines", is_flag=True,
              help="With --free (implied): print only NAME=value lines, for env(1).")
@click.option("--export", "export_lines", is_flag=True,
              help="With --free (implied): print only export lines, for a shell's eval.")
@metrics_options
@runtime_options
@click.option("--json", "json_flag", is_flag=True, help="Print one JSON document (same as --format json).")
@click.option("--format", "output_format", type=click.Choice((*FORMAT_CHOICES, "csv")), default="auto",
              show_default=True,
              help="auto: a table on a terminal, plain text in a pipe or with NO_COLOR; csv: --query's rows.")
@common_options
def ls_command(probe: bool, topology: bool, verbose: bool, no_runtime: bool, force: bool, runtime_status: bool,
               metric_names: tuple[str, ...], list_metrics: bool, query_text: str | None, help_query: bool,
               free: bool, env_lines: bool, export_lines: bool, metrics_addresses: list[str],
               metrics_timeout_s: float, policy: RuntimePolicy, timeout_s: float, json_flag: bool,
               output_format: str) -> int:
    """List accelerator devices, their memory, PCI placement and the processes using them."""
    if help_query:
        from tpu_tools.render.query_view import help_lines

        for line in help_lines():
            click.echo(line)
        return EXIT_OK
    csv_format = output_format == "csv"
    out = Output(resolve_format("plain" if csv_format else output_format, json_flag, sys.stdout))
    if env_lines and export_lines:
        raise UsageError("give --env or --export, not both")
    if free or env_lines or export_lines:
        if query_text or csv_format or probe or force:
            raise UsageError("--free cannot be combined with --query, --format csv, --probe or --force (it never "
                             "opens a device)")
        return _free(policy, timeout_s, out, "env" if env_lines else "export" if export_lines else None)
    names = None
    if query_text is not None or csv_format:
        from tpu_tools.render.query_view import DEFAULT_FIELDS, parse_fields

        try:
            names = parse_fields(query_text) if query_text is not None else DEFAULT_FIELDS
        except ValueError as error:
            raise UsageError(str(error)) from None
    if metric_names:
        from tpu_tools.cli.list_metrics import query_metrics

        return query_metrics(metric_names, metrics_addresses, metrics_timeout_s, min(timeout_s, 2.0), out)
    if list_metrics:
        from tpu_tools.cli.list_metrics import list_metrics as print_metrics

        return print_metrics(metrics_addresses, metrics_timeout_s, min(timeout_s, 2.0), out)
    if no_runtime and (probe or force):
        raise UsageError("--no-runtime cannot be combined with --probe or --force")
    from tpu_tools.metrics.nvml.reader import PendingRead, enabled, nvidia_driver_present

    # NVML's start runs in C while the rest of the listing is imported and discovered.
    nvml_pending = PendingRead(timeout_s) if enabled() and nvidia_driver_present() else None
    from tpu_tools.inventory import RUNTIME_OK, build_inventory

    inventory = build_inventory(policy, timeout_s=timeout_s, probe=probe, use_runtime=not no_runtime,
                                force=force, metrics_addresses=metrics_addresses,
                                metrics_timeout_s=metrics_timeout_s, libtpu_status=runtime_status,
                                nvml_pending=nvml_pending, agent_timeout_s=min(timeout_s, 2.0))
    if is_debug():
        _debug_sources(inventory)
    _write_listing(inventory, names, out, topology, verbose)
    if probe and inventory.runtime_status != RUNTIME_OK:
        note("probe not run: " + "; ".join(inventory.notes))
    return EXIT_FAILURE if inventory.probe_failed else EXIT_OK


def _debug_sources(inventory: Inventory) -> None:
    """--debug: why libtpu's service, NVML or amdsmi gave nothing."""
    _debug_libtpu(inventory)
    if inventory.nvml is not None and inventory.nvml.error:
        note(f"nvml: {inventory.nvml.error}")
    if inventory.amdsmi is not None and inventory.amdsmi.error:
        note(f"amdsmi: {inventory.amdsmi.error}")


def _write_listing(inventory: Inventory, names: tuple[str, ...] | None, out: Output, topology: bool,
                   verbose: bool) -> None:
    """The listing: --query's fields (JSON rows or CSV), else the whole inventory as JSON or a table."""
    if names is not None:
        from tpu_tools.render.query_view import csv_text, rows

        if out.is_json:
            out.json(rows(inventory.summaries(), names))
        else:
            sys.stdout.write(csv_text(inventory.summaries(), names))
    elif out.is_json:
        out.json(inventory.to_dict())
    else:
        _render(inventory, topology, out, verbose)


def _free(policy: RuntimePolicy, timeout_s: float, out: Output, lines: str | None) -> int:
    """--free: passive discovery (and the GPU driver's process list); no runtime is started."""
    from tpu_tools.inventory import build_inventory
    from tpu_tools.pjrt.placement import export_lines

    inventory = build_inventory(policy, timeout_s=timeout_s, use_runtime=False)
    placements = inventory.free_chips()
    if lines is not None:
        chosen = [p for p in placements if p.environment]
        if not chosen:
            why = "no accelerator found" if not placements else "; ".join(n for p in placements for n in p.notes[:1])
            raise RuntimeFailure(f"no free chip to pin a job to: {why}")
        for line in export_lines(chosen, export=lines == "export"):
            out.text(line)
        return EXIT_OK
    if out.is_json:
        out.json({"schema": "tpu-tools/ls-free/v1", "host": inventory.host, "time": inventory.time,
                  "platforms": [p.to_dict() for p in placements], "notes": inventory.all_notes()})
        return EXIT_OK
    from tpu_tools.render.inventory_view import free_chip_lines

    for line in free_chip_lines(placements):
        out.text(line)
    return EXIT_OK


def _debug_libtpu(inventory) -> None:
    """Under --debug: one line when no metrics service answered, and what an answering one left out."""
    answered = [s for s in inventory.libtpu if s.ok]
    if not answered:
        note("libtpu metrics: " + "; ".join(s.error for s in inventory.libtpu))
    for snapshot in answered:
        for line in snapshot.notes:
            note(f"libtpu metrics at {snapshot.address}: {line}")


def _render(inventory, topology: bool, out: Output, verbose: bool = False) -> None:
    from tpu_tools.render.inventory_view import chip_table, device_table, header_line
    from tpu_tools.render.libtpu_view import runtime_status_views, service_device_table
    from tpu_tools.render.nvml_view import driver_line, gpu_health_table, inventory_gpu_table

    out.text(header_line(inventory))
    snapshots = inventory.gpu_snapshots  # NVML's and amdsmi's reads that list GPUs
    nvml_gpus = bool(snapshots)
    for position, snapshot in enumerate(snapshots):
        if position:
            out.text("")
        out.text(driver_line(inventory, snapshot) or "")
        out.table(inventory_gpu_table(inventory, snapshot))
        if verbose:
            out.text("")
            out.table(gpu_health_table(snapshot.gpus))
    if inventory.devices:
        if nvml_gpus:
            out.text("")
            out.text("PJRT devices (JAX's view: memory is XLA's pool in this process)")
        out.table(device_table(inventory))
    elif nvml_gpus:
        others = [c for c in inventory.discovery.chips
                  if not any(s.gpu_for_pci(c.pci_address) for s in snapshots)]
        if others:
            out.text("")
            out.table(chip_table(others, inventory.chip_libtpu, inventory.tpu_health))
    elif inventory.discovery.chips:
        out.table(chip_table(inventory.discovery.chips, inventory.chip_libtpu, inventory.tpu_health))
    else:
        out.text("no accelerator found")
    if not inventory.libtpu_paired and any(s.ok and s.devices for s in inventory.libtpu):
        out.text("")
        out.table(service_device_table(inventory.libtpu))
    for view in runtime_status_views(inventory.libtpu_status) if inventory.libtpu_status is not None else []:
        out.text("")
        if isinstance(view, str):
            out.text(view)
        else:
            out.table(view)
    if topology:
        from tpu_tools.render.topology import draw_topology

        out.text("")
        out.text(draw_topology([e.device for e in inventory.devices]) if inventory.devices
                 else "topology needs the runtime (device coordinates come from PJRT)")
    for line in inventory.all_notes():
        out.text(f"note: {line}")


def main() -> None:
    run_cli(ls_command)
