"""System collectors: OS, kernel, CPU, memory, disks, load, cgroup, container, modules, PCI.

Files come from the discovery root (`TPU_TOOLS_SYSROOT`), so fixture trees can
stand in for a TPU VM. A missing or unreadable source is a note in the
collector's result, not a failure: the rest of what it reads is still useful.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from tpu_tools.accelerators import AMD, GOOGLE, NVIDIA
from tpu_tools.dump.collector import CollectContext, Skipped
from tpu_tools.dump.sysfiles import describe_os_error, parse_key_values, try_text, under_root
from tpu_tools.pjrt.discover import group_chips, read_pci_functions

_KIB = 1024
_PSEUDO_FILESYSTEMS = {"proc", "sysfs", "devpts", "devtmpfs", "cgroup", "cgroup2", "mqueue", "debugfs", "tracefs",
                       "securityfs", "pstore", "bpf", "configfs", "fusectl", "autofs", "binfmt_misc", "rpc_pipefs",
                       "nsfs", "efivarfs", "selinuxfs", "hugetlbfs", "ramfs"}
ACCELERATOR_MODULES = re.compile(r"^(vfio\w*|accel\w*|nvidia\w*|amdgpu|amdkfd|amdxcp|gasket|apex|tpu\w*|google\w*)$")
_VENDOR_NAMES = {GOOGLE: "Google", NVIDIA: "NVIDIA", AMD: "AMD"}


def _path(ctx: CollectContext, path: str) -> Path:
    return under_root(path, ctx.root)


def collect_os(ctx: CollectContext) -> None:
    notes: list[str] = []
    release_text = None
    for candidate in ("/etc/os-release", "/usr/lib/os-release"):
        release_text = try_text(_path(ctx, candidate), notes)
        if release_text is not None:
            ctx.add_text("system/os-release.txt", release_text + "\n", source=candidate)
            break
    uname = os.uname()
    kernel_version = try_text(_path(ctx, "/proc/version"), notes)
    document = {
        "hostname": socket.gethostname(),
        "os_release": parse_key_values(release_text or "", "="),
        "pretty_name": parse_key_values(release_text or "", "=").get("PRETTY_NAME"),
        "kernel": {"sysname": uname.sysname, "release": uname.release, "version": uname.version,
                   "machine": uname.machine, "proc_version": kernel_version},
        "machine": {key: try_text(_path(ctx, f"/sys/class/dmi/id/{key}"), notes)
                    for key in ("sys_vendor", "product_name", "bios_version")},
    }
    if release_text is None:
        notes.append("no os-release file found (/etc/os-release, /usr/lib/os-release)")
    ctx.add_json("system/os.json", document)
    _report(ctx, notes)


def collect_uptime(ctx: CollectContext) -> None:
    notes: list[str] = []
    document: dict = {"uptime_s": None, "load_1m": None, "load_5m": None, "load_15m": None,
                      "runnable_tasks": None, "total_tasks": None}
    uptime = try_text(_path(ctx, "/proc/uptime"), notes)
    if uptime:
        document["uptime_s"] = float(uptime.split()[0])
    load = try_text(_path(ctx, "/proc/loadavg"), notes)
    if load:
        fields = load.split()
        document.update(load_1m=float(fields[0]), load_5m=float(fields[1]), load_15m=float(fields[2]))
        if len(fields) > 3 and "/" in fields[3]:
            runnable, total = fields[3].split("/")
            document.update(runnable_tasks=int(runnable), total_tasks=int(total))
    if uptime is None and load is None:
        raise OSError("neither /proc/uptime nor /proc/loadavg could be read")
    ctx.add_json("system/uptime.json", document)
    _report(ctx, notes)


def collect_cpu(ctx: CollectContext) -> None:
    notes: list[str] = []
    text = try_text(_path(ctx, "/proc/cpuinfo"), notes)
    if text is None:
        raise OSError(notes[0] if notes else "/proc/cpuinfo is missing")
    blocks = [parse_key_values(block) for block in text.split("\n\n") if block.strip()]
    processors = [b for b in blocks if "processor" in b]
    first = processors[0] if processors else (blocks[0] if blocks else {})
    cores = {(b.get("physical id", "0"), b.get("core id", b.get("processor"))) for b in processors}
    flags = set(first.get("flags", first.get("Features", "")).split())
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    ctx.add_json("system/cpu.json", {
        "model": first.get("model name") or first.get("Model") or first.get("CPU part"),
        "vendor": first.get("vendor_id") or first.get("CPU implementer"),
        "logical_cpus": len(processors) or os.cpu_count(),
        "physical_cores": len(cores) if processors and "core id" in first else None,
        "sockets": len({b.get("physical id") for b in processors}) if "physical id" in first else None,
        "usable_cpus": usable,
        "numa_nodes": _numa_nodes(ctx),
        "vector_extensions": sorted(f for f in flags if re.match(r"^(avx\w*|amx\w*|sve\w*|asimd\w*|fma)$", f)),
    })
    ctx.add_text("system/cpuinfo.txt", text + "\n", source="/proc/cpuinfo")
    _report(ctx, notes)


def _numa_nodes(ctx: CollectContext) -> dict[str, str | None]:
    base = _path(ctx, "/sys/devices/system/node")
    try:
        names = sorted(n for n in os.listdir(base) if re.fullmatch(r"node\d+", n))
    except OSError:
        return {}
    return {name: try_text(base / name / "cpulist") for name in names}


def collect_memory(ctx: CollectContext) -> None:
    path = _path(ctx, "/proc/meminfo")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read(1 << 20)
    values = parse_key_values(text)

    def kib(key: str) -> int | None:
        match = re.match(r"(\d+)", values.get(key, ""))
        return int(match.group(1)) * _KIB if match else None

    ctx.add_json("system/memory.json", {
        "total_bytes": kib("MemTotal"), "available_bytes": kib("MemAvailable"), "free_bytes": kib("MemFree"),
        "cached_bytes": kib("Cached"), "swap_total_bytes": kib("SwapTotal"), "swap_free_bytes": kib("SwapFree"),
        "shmem_bytes": kib("Shmem"), "hugepages_total": int(values["HugePages_Total"])
        if values.get("HugePages_Total", "").isdigit() else None, "hugepage_size_bytes": kib("Hugepagesize"),
    })
    ctx.add_text("system/meminfo.txt", text, source="/proc/meminfo")


def collect_disks(ctx: CollectContext) -> None:
    text = try_text(_path(ctx, "/proc/mounts"))
    if text is None:
        raise OSError("/proc/mounts is not readable")
    mounts, seen = [], set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] in _PSEUDO_FILESYSTEMS or fields[1] in seen:
            continue
        mount_point = fields[1].replace("\\040", " ")
        seen.add(fields[1])
        entry = {"device": fields[0], "mount_point": mount_point, "fs_type": fields[2],
                 "read_only": "ro" in fields[3].split(","), "total_bytes": None, "free_bytes": None,
                 "available_bytes": None, "inodes_free": None}
        target = _path(ctx, mount_point)
        try:
            usage = os.statvfs(target)  # may block on a dead network mount: the runner's timeout covers it
            entry.update(total_bytes=usage.f_blocks * usage.f_frsize, free_bytes=usage.f_bfree * usage.f_frsize,
                         available_bytes=usage.f_bavail * usage.f_frsize, inodes_free=usage.f_favail)
        except OSError as error:
            entry["error"] = describe_os_error(error)
        mounts.append(entry)
    ctx.add_json("system/disks.json", {"mounts": mounts})


def _cgroup_paths(ctx: CollectContext, notes: list[str]) -> tuple[str | None, dict[str, str]]:
    """The unified (v2) path and the v1 controller -> path map of this process."""
    text = try_text(_path(ctx, "/proc/self/cgroup"), notes) or ""
    unified, v1 = None, {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        for controller in parts[1].split(","):
            if controller:
                v1[controller] = parts[2]
    return unified, v1


_V2_FILES = ("memory.max", "memory.high", "memory.current", "memory.peak", "memory.swap.max", "memory.events",
             "cpu.max", "cpu.weight", "cpuset.cpus.effective", "pids.max", "pids.current")
_V1_FILES = {"memory": ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes",
                        "memory.failcnt", "memory.oom_control"),
             "cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares"),
             "cpuset": ("cpuset.cpus",), "pids": ("pids.max", "pids.current")}


def collect_cgroup(ctx: CollectContext) -> None:
    notes: list[str] = []
    unified, v1 = _cgroup_paths(ctx, notes)
    base = _path(ctx, "/sys/fs/cgroup")
    document: dict = {"version": None, "path": unified, "limits": {}}
    if (base / "cgroup.controllers").exists() or ((base / "unified").exists() and not v1):
        document["version"] = 2
        folder = base / (unified or "/").lstrip("/")
        for name in _V2_FILES:
            value = try_text(folder / name, notes)
            if value is not None:
                document["limits"][name] = value
    elif v1:
        document["version"] = 1
        document["path"] = v1.get("memory") or v1.get("cpu")
        for controller, names in _V1_FILES.items():
            candidates = [base / controller / v1.get(controller, "/").lstrip("/"), base / controller]
            for name in names:
                for folder in candidates:
                    value = try_text(folder / name)
                    if value is not None:
                        document["limits"][name] = value
                        break
    else:
        notes.append("no cgroup information found")
    limits = document["limits"]
    events = parse_key_values(limits.get("memory.events") or limits.get("memory.oom_control", ""), " ")
    document["oom_kills"] = int(events["oom_kill"]) if events.get("oom_kill", "").isdigit() else None
    ctx.add_json("system/cgroup.json", document)
    _report(ctx, notes)


def collect_container(ctx: CollectContext) -> None:
    evidence: list[str] = []
    kind = None
    for marker, name in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if _path(ctx, marker).exists():
            evidence.append(f"{marker} exists")
            kind = kind or name
    environment_kind = os.environ.get("container")
    if environment_kind:
        evidence.append(f"container={environment_kind} in the environment")
        kind = kind or environment_kind
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        evidence.append("KUBERNETES_SERVICE_HOST is set")
        kind = "kubernetes"
    for source in ("/proc/1/cgroup", "/proc/self/cgroup"):
        text = try_text(_path(ctx, source)) or ""
        for word, name in (("kubepods", "kubernetes"), ("docker", "docker"), ("libpod", "podman"),
                           ("containerd", "containerd"), ("lxc", "lxc")):
            if word in text:
                evidence.append(f"{source} mentions {word}")
                kind = kind or name
                break
    mountinfo = try_text(_path(ctx, "/proc/self/mountinfo")) or ""
    root_line = next((line for line in mountinfo.splitlines() if line.split()[4:5] == ["/"]), "")
    if " - overlay " in root_line:
        evidence.append("the root filesystem is an overlay")
        kind = kind or "container"
    ctx.add_json("system/container.json", {"in_container": bool(evidence), "kind": kind, "evidence": evidence})


def collect_cmdline(ctx: CollectContext) -> None:
    path = _path(ctx, "/proc/cmdline")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read(1 << 16)
    ctx.add_text("system/cmdline.txt", text.strip() + "\n", source="/proc/cmdline")


def collect_modules(ctx: CollectContext) -> None:
    notes: list[str] = []
    text = try_text(_path(ctx, "/proc/modules"), notes)
    loaded = []
    for line in (text or "").splitlines():
        fields = line.split()
        if fields and ACCELERATOR_MODULES.match(fields[0]):
            loaded.append({"name": fields[0], "size_bytes": int(fields[1]) if fields[1:2] and fields[1].isdigit()
                           else None, "used_by": [u for u in (fields[3] if len(fields) > 3 else "-").split(",")
                                                  if u and u != "-"],
                           "state": fields[4] if len(fields) > 4 else None,
                           "version": try_text(_path(ctx, f"/sys/module/{fields[0]}/version"))})
    built_in = []
    try:
        names = sorted(os.listdir(_path(ctx, "/sys/module")))
    except OSError:
        names = []
    listed = {m["name"] for m in loaded}
    built_in = [n for n in names if ACCELERATOR_MODULES.match(n) and n not in listed]
    if text is None:
        notes.append("/proc/modules is not available (a kernel without loadable modules?)")
    ctx.add_json("system/modules.json", {"loaded": loaded, "built_in_or_sysfs_only": built_in,
                                         "modules_listed": len((text or "").splitlines())})
    _report(ctx, notes)


def _link_speed(directory: Path, prefix: str) -> str | None:
    speed = try_text(directory / f"{prefix}_link_speed")
    width = try_text(directory / f"{prefix}_link_width")
    if not speed and not width:
        return None
    return f"{speed or '?'} x{width or '?'}"


def collect_pci(ctx: CollectContext) -> None:
    notes: list[str] = []
    chips = group_chips(read_pci_functions(ctx.root, notes))
    functions, lines = [], []
    for spec, members in chips:
        for function in members:
            directory = _path(ctx, f"/sys/bus/pci/devices/{function.address}")
            try:
                driver = os.path.basename(os.readlink(directory / "driver"))
            except OSError:
                driver = None
            entry = {
                "address": function.address, "chip": spec.name, "vendor_id": f"0x{function.vendor_id:04x}",
                "device_id": f"0x{function.device_id:04x}",
                "subsystem_device_id": None if function.subsystem_device_id is None
                else f"0x{function.subsystem_device_id:04x}",
                "class_id": f"0x{function.class_id:04x}", "driver": driver, "numa_node": function.numa_node,
                "iommu_group": function.iommu_group, "cpu_affinity": function.cpu_affinity,
                "link_current": _link_speed(directory, "current"), "link_max": _link_speed(directory, "max"),
            }
            functions.append(entry)
            vendor = _VENDOR_NAMES.get(function.vendor_id, "?")
            lines.append(f"{function.address} [{function.class_id:04x}]: {vendor} {spec.name} "
                         f"[{function.vendor_id:04x}:{function.device_id:04x}] driver={driver or '-'} "
                         f"numa={function.numa_node if function.numa_node is not None else '-'} "
                         f"link={entry['link_current'] or '-'} (max {entry['link_max'] or '-'})")
    if not functions and not notes:
        raise Skipped("no accelerator PCI functions (Google TPU, NVIDIA or AMD GPU) on this host")
    ctx.add_json("system/pci.json", {"functions": functions})
    ctx.add_text("system/pci.txt", "\n".join(lines) + "\n" if lines else "")
    _report(ctx, notes)


def _report(ctx: CollectContext, notes: list[str]) -> None:
    for note in notes:
        ctx.note(note)
