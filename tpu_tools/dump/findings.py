"""What a support engineer wants first from a bundle: a summary and the warnings.

Built from the bundle's own files (not from the manifest alone), so a bundle
written by an older version is summarised by what it contains. Each warning
names a problem that often explains a failed job: versions that do not agree,
a device held by a process that is dead or stuck, a device that failed its
probe, a TPU core that libtpu reports in error, a workload that recompiles or
whose agent does not answer, OOM kills, a cache that cannot be written.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tpu_tools.dump.accelerator_files import (
    DISCOVERY,
    RUNTIME,
    AgentItem,
    AgentsFile,
    CompilerMetadata,
    DecodedFile,
    DiagnosticsIndex,
    DiscoveryFile,
    GpuSnapshotFile,
    NodeHolder,
    RuntimeFile,
    RuntimeInfo,
    read_file,
)
from tpu_tools.dump.collectors.diagnostics import INDEX as DIAGNOSTICS_INDEX
from tpu_tools.dump.collectors.diagnostics import stall_cores
from tpu_tools.dump.libtpusummary import LibtpuSummary, libtpu_summary
from tpu_tools.dump.manifest import CollectorStatus, RedactionCounts
from tpu_tools.dump.reader import Bundle, BundleError
from tpu_tools.dump.software_files import (
    CgroupFile,
    CompileCacheFile,
    PackagesFile,
    PythonFile,
    StackFile,
    StackVersions,
)
from tpu_tools.metrics.nvml.decode import POWER_REASONS, THERMAL_REASONS
from tpu_tools.metrics.records.agent import StartupFinding
from tpu_tools.metrics.records.gpu import STATUS_LOST, STATUS_NOT_ANSWERING, GpuRecord
from tpu_tools.metrics.records.jobs import ChipHealth
from tpu_tools.metrics.tpuhealth import attention
from tpu_tools.outside import OutsideError
from tpu_tools.shorten import shorten

SHOW_SCHEMA = "tpu-tools/dump-show/v1"
_KERNEL_ERROR = re.compile(r"(?i)\b(error|fail\w*|fault|timeout|timed out|xid|reset|oom[-_ ]kill\w*|"
                           r"out of memory|blocked for more than)\b")


@dataclass
class Finding:
    kind: str
    message: str


class BundleInfo(msgspec.Struct, kw_only=True):
    path: str
    size_bytes: int
    top: str  # the folder the members are under
    member_count: int


class SoftwareVersions(msgspec.Struct, kw_only=True):
    """The stack's versions as the bundle recorded them (software/stack.json, software/python.json)."""

    jax: str | None = None
    jaxlib: str | None = None
    libtpu: str | None = None
    plugins: dict[str, str | None] = {}  # PJRT plugin distribution -> version
    tpu_tools: str | None = None
    python: str | None = None
    agree: bool | None = None  # whether the installed versions satisfy each other's requirements


class FileSummary(msgspec.Struct, kw_only=True):
    name: str
    size_bytes: int
    collector: str | None
    redactions: int  # values redacted in it, all kinds
    trimmed_from_bytes: int | None


class UnsafeMember(msgspec.Struct, kw_only=True):
    name: str
    type: str
    problem: str | None


class HolderSummary(msgspec.Struct, kw_only=True):
    pid: int | None
    command: str | None


class DevicesSummary(msgspec.Struct, kw_only=True):
    """The runtime listing and the chips the bundle recorded (accelerators/runtime.json, discovery.json)."""

    runtime_status: str | None = None
    platform: str | None = None
    platform_version: str | None = None
    device_count: int = 0
    device_kinds: dict[str, int] = {}  # device kind -> devices
    probe_passed: int = 0
    probe_failed: int = 0
    chips: dict[str, int] = {}  # chip name -> chips
    holders: list[HolderSummary] = []


class RecompileSummary(msgspec.Struct, kw_only=True):
    function: str | None
    reason: str | None


class AgentSummary(msgspec.Struct, kw_only=True):
    """One agent's job as the bundle recorded it (accelerators/agents.json)."""

    pid: int
    tag: str | None
    platform: str | None
    error: str | None
    compile_count: int | None
    recompile_count: int | None
    device_memory_used_bytes: int | None
    steps_per_second: float | None
    last_recompile: RecompileSummary | None
    tpu_health: ChipHealth | None
    startup: list[StartupFinding]


class AgentsSummary(msgspec.Struct, kw_only=True):
    agents: list[AgentSummary] = []
    ignored_sockets: int = 0


class Summary(msgspec.Struct, kw_only=True):
    """`tpu-dump show`'s document (schema `tpu-tools/dump-show/v1`), in its JSON key order."""

    schema: str = SHOW_SCHEMA
    bundle: BundleInfo
    host: str | None
    time: str | None
    tool_version: str | None
    duration_s: float | None
    redaction: RedactionCounts
    devices: DevicesSummary = msgspec.field(default_factory=DevicesSummary)
    versions: SoftwareVersions = msgspec.field(default_factory=SoftwareVersions)
    libtpu: LibtpuSummary | None = None  # None: the bundle holds no libtpu figures
    agents: AgentsSummary | None = None  # None: the bundle holds no agent snapshots
    collectors: list[CollectorStatus]
    warnings: list[Finding] = []
    files: list[FileSummary] = []
    unsafe_members: list[UnsafeMember] = []
    notes: list[str] = []
    failed_collectors: list[str | None] = []  # names of the collectors that failed or timed out


def _devices(bundle: Bundle) -> DevicesSummary:
    runtime = read_file(bundle, RUNTIME, RuntimeFile) or RuntimeFile()
    discovery = read_file(bundle, DISCOVERY, DiscoveryFile) or DiscoveryFile()
    holders = sorted({(h.pid, h.command) for chip in discovery.chips for h in chip.holders}, key=lambda h: h[0] or 0)
    probes = [device.probe for device in runtime.devices if device.probe is not None]
    info = runtime.runtime or RuntimeInfo()
    return DevicesSummary(
        runtime_status=runtime.runtime_status, platform=info.platform, platform_version=info.platform_version,
        device_count=len(runtime.devices),
        device_kinds=dict(Counter(str(device.device_kind) for device in runtime.devices)),
        probe_passed=sum(1 for probe in probes if probe.ok), probe_failed=sum(1 for probe in probes if not probe.ok),
        chips=dict(Counter(str(chip.name) for chip in discovery.chips)),
        holders=[HolderSummary(pid=pid, command=command) for pid, command in holders])


def _versions(bundle: Bundle) -> SoftwareVersions:
    stack = read_file(bundle, "software/stack.json", StackFile) or StackFile()
    python = read_file(bundle, "software/python.json", PythonFile) or PythonFile()
    versions = stack.versions or StackVersions()
    return SoftwareVersions(jax=versions.jax, jaxlib=versions.jaxlib, libtpu=versions.libtpu,
                            plugins=versions.plugins, tpu_tools=versions.tpu_tools, python=python.version,
                            agree=stack.agree)


def _libtpu(bundle: Bundle) -> LibtpuSummary | None:
    document = bundle.read_json("accelerators/libtpu.json")
    return libtpu_summary(document) if isinstance(document, dict) else None


def _agents(bundle: Bundle) -> AgentsSummary | None:
    document = bundle.read_json("accelerators/agents.json")
    if not isinstance(document, dict):
        return None
    listed = msgspec.convert(document, AgentsFile)
    items = []
    for raw in listed.agents if isinstance(listed.agents, list) else []:
        try:
            items.append(msgspec.convert(raw, AgentItem))
        except msgspec.ValidationError:
            continue  # not an agent entry: nothing to say about it
    return AgentsSummary(agents=[_agent_summary(item) for item in items],
                         ignored_sockets=len(listed.ignored_sockets) if isinstance(listed.ignored_sockets, list) else 0)


def _agent_summary(item: AgentItem) -> AgentSummary:
    from tpu_tools.metrics.agent_client import AgentResult
    from tpu_tools.metrics.agent_snapshot import snapshot_record
    from tpu_tools.metrics.groups.processes import agent_entry
    from tpu_tools.metrics.records.jobs import EntryCompiles, EntrySteps

    error = item.error if isinstance(item.error, str) else None
    snapshot = None
    if item.snapshot is not None:
        try:
            snapshot = snapshot_record(item.snapshot)
        except OutsideError as problem:
            error = str(problem)
    socket = Path(item.socket) if isinstance(item.socket, str) else Path("-")
    entry = agent_entry(AgentResult(item.pid, socket, snapshot, error))
    compiles = entry.compiles or EntryCompiles()
    recent = compiles.recent_recompiles
    return AgentSummary(
        pid=entry.pid, tag=entry.tag or (item.tag if isinstance(item.tag, str) else None), platform=entry.platform,
        error=entry.error, compile_count=compiles.compile_count, recompile_count=compiles.recompile_count,
        device_memory_used_bytes=entry.device_memory_used_bytes,
        steps_per_second=(entry.steps or EntrySteps()).steps_per_second,
        last_recompile=RecompileSummary(function=recent[-1].function, reason=recent[-1].reason) if recent else None,
        tpu_health=entry.tpu_sdk.health if entry.tpu_sdk else None, startup=entry.startup or [])


def _tolerant(read: Any, bundle: Any, notes: list[str], *args: Any) -> Any:
    """A summary part from a file of unexpected shape (a hostile or damaged bundle) is a note, not a crash."""
    try:
        return read(bundle, *args)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError, RecursionError) as error:
        notes.append(f"a file of the bundle could not be summarised ({read.__name__.strip('_')}: "
                     f"{type(error).__name__})")
        return None


def _job_warnings(summary: Summary, out: list[Finding]) -> None:
    for core in summary.libtpu.cores_in_error if summary.libtpu is not None else []:
        kind = (core.core_type or "core").replace("_", " ")
        out.append(Finding("libtpu_core_error", f"core {core.global_core_id} (chip {core.chip_id}, {kind}) at "
                                                f"{core.address} is in error: {core.error_message}"))
    for agent in summary.agents.agents if summary.agents is not None else []:
        who = f"process {agent.pid}" + (f" ({agent.tag})" if agent.tag else "")
        if agent.error:
            out.append(Finding("agent_error", f"the agent of {who} did not answer: {agent.error}"))
            continue
        for line in attention(agent.tpu_health):
            out.append(Finding("tpu_health", f"{who}: {line}"))
        for broken in agent.startup:  # the startup contract (torch_xla), each with its fix
            out.append(Finding("startup_contract", f"{who}: {broken.message}; {broken.fix}"))
        if agent.recompile_count:
            last = agent.last_recompile
            reason = f"; last: {last.function}" + (f": {last.reason}" if last.reason else "") if last else ""
            out.append(Finding("recompiles", f"{who} compiled functions again {agent.recompile_count} "
                                             f"time{'s' if agent.recompile_count != 1 else ''}{reason}"))


def _libtpu_file_warnings(bundle: Bundle, out: list[Finding]) -> None:
    """libtpu's stall and crash files the bundle holds: stalled cores with program and HLO location."""
    index = read_file(bundle, DIAGNOSTICS_INDEX, DiagnosticsIndex) or DiagnosticsIndex()
    for entry in index.files:
        name = shorten(os.path.basename(str(entry.path)), 200)
        decoded = read_file(bundle, entry.decoded, DecodedFile) if entry.decoded is not None else None
        document = decoded.decoded if decoded is not None else None
        if entry.kind == "stall_summary" and document is not None:
            cores = stall_cores(document)
            out.append(Finding("libtpu_stall", f"libtpu stall summary {name}: " + ("; ".join(cores) or "no cores")))
        elif entry.kind == "core_dump":
            out.append(Finding("libtpu_core_dump", f"libtpu core dump {name}" + (
                " (decoded)" if document is not None else f": {entry.error or 'not decoded'}")))
        elif entry.kind == "compiler_metadata" and isinstance(document, dict):
            program = msgspec.convert(document, CompilerMetadata)
            out.append(Finding("libtpu_program", f"libtpu compiler metadata {name}: module "
                                                 f"{shorten(str(program.module_name or '?'), 200)}, program id "
                                                 f"{shorten(str(program.program_id), 24)}"))
        elif document is None:
            out.append(Finding("libtpu_file", f"libtpu {str(entry.kind).replace('_', ' ')} {name}: "
                                              f"{shorten(str(entry.error or 'not decoded'), 300)}"))


def _stack_warnings(bundle: Bundle, out: list[Finding]) -> None:
    stack = read_file(bundle, "software/stack.json", StackFile) or StackFile()
    for check in stack.checks:
        if check.ok is False:
            how = f" (jax[{'|'.join(check.via_extras)}])" if check.via_extras else ""
            out.append(Finding("version_mismatch", f"{check.distribution} {check.installed_version} "
                                                   f"does not satisfy {check.requirement}, required by "
                                                   f"{check.required_by}{how}"))
    packages = read_file(bundle, "software/packages.json", PackagesFile) or PackagesFile()
    for item in packages.shadowed:
        if re.match(r"^(jax|jaxlib|libtpu|jax-(cuda|rocm))", str(item.name)):
            out.append(Finding("shadowed_package", f"{item.name} {item.version} in {item.location} is hidden by "
                                                   f"version {item.shadowed_by} earlier on sys.path"))


def _holder_warnings(bundle: Bundle, out: list[Finding]) -> None:
    discovery = read_file(bundle, DISCOVERY, DiscoveryFile) or DiscoveryFile()
    troubled: dict[int | None, tuple[NodeHolder, list[str]]] = {}  # pid -> (holder, device nodes)
    for chip in discovery.chips:
        for node in chip.device_nodes:
            for holder in node.holders:
                if holder.state in ("Z", "X", "D") or holder.alive is False:
                    troubled.setdefault(holder.pid, (holder, []))[1].append(str(node.path))
            if node.exists and node.accessible is False:
                out.append(Finding("no_access", f"{node.path} (mode {node.mode}, uid {node.uid}, gid {node.gid}) "
                                                "cannot be opened by the user who ran tpu-dump"))
    for pid, (holder, nodes) in troubled.items():
        who = f"{', '.join(nodes)} {'is' if len(nodes) == 1 else 'are'} held by process {pid} " \
              f"({(holder.command or '?').split(' ')[0]})"
        if holder.state == "D":
            out.append(Finding("stuck_holder", f"{who}, stuck in an uninterruptible wait (state D): a driver call "
                                               "that does not return"))
        else:
            out.append(Finding("dead_holder", f"{who}, which has exited ({holder.state_name or 'gone'}) "
                                              "but still has them open; the devices stay busy until every thread "
                                              "of it ends"))
    for note in discovery.notes:
        if "is missing" in note:
            out.append(Finding("missing_device_node", note))


def _runtime_warnings(bundle: Bundle, out: list[Finding]) -> None:
    runtime = read_file(bundle, RUNTIME, RuntimeFile) or RuntimeFile()
    for device in runtime.devices:
        if device.probe is not None and not device.probe.ok:
            out.append(Finding("probe_failed", f"device {device.id} ({device.device_kind}) failed "
                                               f"the probe: {device.probe.error}"))
    if runtime.runtime_status == "held":
        for note in runtime.notes:
            if "held by" in note:
                out.append(Finding("device_held", note.replace("(or --force,", "(or --force-runtime,")))


def _gpus_in(bundle: Bundle, path: str) -> list[GpuRecord]:
    """The GPUs of a bundle's GPU snapshot as records; a GPU whose entry does not decode is left out (a damaged
    file still tells what the rest of it says)."""
    listed = read_file(bundle, path, GpuSnapshotFile) or GpuSnapshotFile()
    gpus = []
    for raw in listed.gpus:
        try:
            gpus.append(msgspec.json.decode(raw, type=GpuRecord))
        except (msgspec.DecodeError, RecursionError):
            continue
    return gpus


def _gpu_warnings(bundle: Bundle, out: list[Finding]) -> None:
    """From the NVML and amdsmi snapshots: a lost or silent GPU, ECC errors, remapped rows, thermal or power
    slowdown."""
    for path, source, kind in (("accelerators/nvml.json", "NVML", "NVIDIA GPU"),
                               ("accelerators/amdsmi.json", "amdsmi", "AMD GPU")):
        _snapshot_warnings(_gpus_in(bundle, path), source, kind, out)


def _snapshot_warnings(gpus: list[GpuRecord], source: str, kind: str, out: list[Finding]) -> None:
    for gpu in gpus:
        who = f"GPU {gpu.index} ({gpu.name or kind}, {gpu.pci_bus_id or 'bus id unknown'})"
        if gpu.status == STATUS_LOST:
            out.append(Finding("gpu_lost", f"{who} is lost (NVML: GPU_IS_LOST): it fell off the bus or needs a "
                                           "reset; jobs on it fail until then"))
            continue
        if gpu.status == STATUS_NOT_ANSWERING:
            out.append(Finding("gpu_not_answering", f"{who} did not answer {source} in time: a hung driver call"))
            continue
        volatile, aggregate = gpu.ecc_volatile_uncorrected_errors, gpu.ecc_aggregate_uncorrected_errors
        if (volatile or 0) > 0 or (aggregate or 0) > 0:
            lifetime = "" if aggregate is None and source != "NVML" else f", {aggregate or 0} in its lifetime"
            out.append(Finding("gpu_ecc_errors", f"{who} has uncorrected ECC errors: {volatile or 0} since the "
                                                 f"driver loaded{lifetime}"))
        if (gpu.remapped_rows_uncorrectable or 0) > 0 or gpu.remapped_rows_pending or gpu.remapped_rows_failed:
            state = "; a remapping failed: replace the GPU" if gpu.remapped_rows_failed else \
                ("; a remapping waits for a GPU reset" if gpu.remapped_rows_pending else "")
            out.append(Finding("gpu_remapped_rows", f"{who} remapped {gpu.remapped_rows_uncorrectable or 0} "
                                                    f"rows after uncorrectable memory errors{state}"))
        _link_warnings(gpu, who, out)
        reasons = set(gpu.clock_event_reasons or [])
        for slowdown, names in (("thermal", THERMAL_REASONS), ("power", POWER_REASONS)):
            active = sorted(reasons & names)
            if active:
                out.append(Finding(f"gpu_{slowdown}_slowdown", f"{who} is slowed down ({', '.join(active)}) at "
                                                               f"{gpu.temperature_celsius} C, "
                                                               f"{gpu.power_draw_watts} W"))


def _link_warnings(gpu: GpuRecord, who: str, out: list[Finding]) -> None:
    """A PCIe link narrower than its maximum, PCIe replays, NVLink links down, XID errors a monitor counted."""
    width, widest = gpu.pcie_link_width, gpu.pcie_link_width_max
    if width is not None and widest is not None and width < widest:
        out.append(Finding("gpu_pcie_degraded", f"{who} runs its PCIe link at x{width} of x{widest} (generation "
                                                f"{gpu.pcie_link_generation} of "
                                                f"{gpu.pcie_link_generation_max}): a bad riser or slot"))
    if (gpu.pcie_replay_errors or 0) > 0:
        out.append(Finding("gpu_pcie_replays", f"{who} counted {gpu.pcie_replay_errors} PCIe replays since the "
                                               "driver loaded (link-level retransmissions: a marginal link)"))
    if gpu.nvlink_links_down:
        out.append(Finding("gpu_nvlink_down", f"{who} has NVLink links down: "
                                              f"{', '.join(str(d) for d in gpu.nvlink_links_down)} of "
                                              f"{gpu.nvlink_links}"))
    if gpu.xid_errors:
        counts = ", ".join(f"XID {code} x{count}" for code, count in sorted(gpu.xid_errors.items()))
        out.append(Finding("gpu_xid_errors", f"{who} reported {counts}"))


def _system_warnings(bundle: Bundle, out: list[Finding]) -> None:
    cgroup = read_file(bundle, "system/cgroup.json", CgroupFile) or CgroupFile()
    if cgroup.oom_kills:
        out.append(Finding("oom_kills", f"the OOM killer ended {cgroup.oom_kills} processes in this cgroup"))
    cache = read_file(bundle, "software/compile_cache.json", CompileCacheFile) or CompileCacheFile()
    if cache.exists and cache.writable is False:
        out.append(Finding("compile_cache", f"the compilation cache {cache.path} is not writable"))
    try:
        kernel = bundle.read("logs/kernel.txt").decode("utf-8", "replace").splitlines()
    except BundleError:
        kernel = []
    errors = [line for line in kernel if not line.startswith("#") and _KERNEL_ERROR.search(line)]
    if errors:
        last = shorten(errors[-1].strip(), 160)
        out.append(Finding("kernel_errors", f"{len(errors)} kernel messages about accelerators, PCIe or memory "
                                            f"report errors (see logs/kernel.txt); last: {last}"))


def summarize(bundle: Bundle) -> Summary:
    manifest = bundle.manifest  # decoded into its record, bounded, when the bundle was opened
    listed = {entry.name: entry for entry in manifest.files or []}
    files = []
    for member in bundle.members:
        if member.problem is None and member.type == "file":
            entry = listed.get(member.relative)
            files.append(FileSummary(name=member.relative, size_bytes=member.size_bytes,
                                     collector=entry.collector if entry else None,
                                     redactions=sum(count or 0 for count in ((entry.redactions if entry else None)
                                                                             or {}).values()),
                                     trimmed_from_bytes=entry.trimmed_from_bytes if entry else None))
    collectors = [CollectorStatus(name=c.name, status=c.status, error=c.error, duration_s=c.duration_s)
                  for c in manifest.collectors or []]
    summary = Summary(
        bundle=BundleInfo(path=str(bundle.path), size_bytes=bundle.size_bytes, top=bundle.top,
                          member_count=len(bundle.members)),
        host=manifest.host, time=manifest.time, tool_version=manifest.tool_version, duration_s=manifest.duration_s,
        redaction=manifest.redaction or RedactionCounts(), collectors=collectors, files=files,
        unsafe_members=[UnsafeMember(name=m.name, type=m.type, problem=m.problem) for m in bundle.members
                        if m.problem is not None],
        notes=[*(note for note in manifest.notes or [] if note is not None), *bundle.notes],
        failed_collectors=[c.name for c in collectors if c.status in ("failed", "timed_out")],
    )
    summary.devices = _tolerant(_devices, bundle, summary.notes) or DevicesSummary()
    summary.versions = _tolerant(_versions, bundle, summary.notes) or SoftwareVersions()
    summary.libtpu = _tolerant(_libtpu, bundle, summary.notes)
    summary.agents = _tolerant(_agents, bundle, summary.notes)
    warnings = summary.warnings
    if summary.redaction.enabled is False:
        warnings.append(Finding("not_redacted", "this bundle was written with --no-redact: it may contain "
                                                "passwords, tokens and keys"))
    for unsafe in summary.unsafe_members:
        warnings.append(Finding("unsafe_member", f"{unsafe.name!r}: {unsafe.problem}"))
    for problem in bundle.integrity_problems():
        warnings.append(Finding("integrity", problem))
    for check in (_stack_warnings, _holder_warnings, _runtime_warnings, _gpu_warnings, _system_warnings,
                  _libtpu_file_warnings):
        _tolerant(check, bundle, summary.notes, warnings)
    _tolerant(_job_warnings, summary, summary.notes, warnings)
    return summary
