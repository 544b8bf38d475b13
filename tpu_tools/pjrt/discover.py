"""Passive discovery: accelerators and who holds them, without opening any device.

Reads PCI functions from sysfs, maps them to their device nodes, and scans
`/proc/*/fd` for processes holding those nodes. Everything is read below a
root directory (`TPU_TOOLS_SYSROOT`, default `/`) so tests can point it at a
fixture tree. Nothing here raises for a missing, unreadable or malformed file:
what cannot be read becomes a note.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.accelerators import (
    AMD,
    AMD_GPU_CLASSES,
    GOOGLE,
    NVIDIA,
    NVIDIA_GPU_CLASSES,
    ChipSpec,
    generic_gpu_spec,
    gpu_spec_for_pci,
    tpu_spec_for_pci,
)

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
_PROCESSING_ACCELERATOR_CLASS = 0x1200
_SHARED_NODES = {
    "nvidia": ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"),
    "amd": ("/dev/kfd",),
}


def sysroot() -> Path:
    """The root passive discovery reads: $TPU_TOOLS_SYSROOT, else /."""
    return Path(os.environ.get("TPU_TOOLS_SYSROOT") or "/")


@dataclass
class Holder:
    """A process that holds a device open (found in /proc/*/fd), with its user and command line."""

    pid: int
    user: str
    command: str
    frontend: str | None = None  # jax or torch_xla, as the process's agent says; None: no agent answered for it

    def to_dict(self) -> dict[str, Any]:
        """The holder as tpu-ls --json writes it (holders[])."""
        return asdict(self)


@dataclass
class DeviceNode:
    path: str
    exists: bool
    mode: str | None = None  # octal permission bits, e.g. "0660"
    uid: int | None = None
    gid: int | None = None
    holders: list[Holder] = field(default_factory=list)


@dataclass
class PciFunction:
    address: str  # domain:bus:device.function
    vendor_id: int
    device_id: int
    subsystem_device_id: int | None
    class_id: int  # the top 16 bits of the PCI class code
    numa_node: int | None
    cpu_affinity: str | None  # local_cpulist, e.g. "0-47"
    iommu_group: int | None


@dataclass
class Chip:
    index: int
    name: str
    vendor: str
    platform: str
    pci_address: str
    pci_functions: list[str]
    numa_node: int | None
    cpu_affinity: str | None
    iommu_group: int | None
    devices_per_chip: int | None
    cores_per_chip: int | None
    hbm_bytes: int | None = None  # memory per chip, from the chip's published figures
    device_nodes: list[DeviceNode] = field(default_factory=list)

    @property
    def holders(self) -> list[Holder]:
        seen: dict[int, Holder] = {}
        for node in self.device_nodes:
            for holder in node.holders:
                seen.setdefault(holder.pid, holder)
        return sorted(seen.values(), key=lambda h: h.pid)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["holders"] = [h.to_dict() for h in self.holders]
        return data


@dataclass
class Discovery:
    chips: list[Chip] = field(default_factory=list)
    shared_nodes: list[DeviceNode] = field(default_factory=list)  # nvidiactl, kfd, ...
    libtpu_lock_holders: list[Holder] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chips": [c.to_dict() for c in self.chips],
            "shared_nodes": [asdict(n) for n in self.shared_nodes],
            "libtpu_lock_holders": [h.to_dict() for h in self.libtpu_lock_holders],
            "notes": list(self.notes),
        }

    def chips_for_platform(self, platform: str) -> list[Chip]:
        return [c for c in self.chips if c.platform == platform]

    def tpu_holders(self, exclude_pids: set[int] | frozenset[int] = frozenset()) -> list[Holder]:
        """Processes other than `exclude_pids` that hold a TPU chip or libtpu's lock."""
        found: dict[int, Holder] = {}
        for chip in self.chips_for_platform("tpu"):
            for holder in chip.holders:
                found.setdefault(holder.pid, holder)
        for holder in self.libtpu_lock_holders:
            found.setdefault(holder.pid, holder)
        return [h for pid, h in sorted(found.items()) if pid not in exclude_pids]


# --- small readers that never raise --------------------------------------------------------------

def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except (OSError, ValueError):
        return None


def _read_hex(path: Path) -> int | None:
    text = _read_text(path)
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


# --- PCI -------------------------------------------------------------------------------------------

# The PCI functions of other vendors, by sysfs entry (its path and inode): a function's vendor does not change while
# its entry stands (a hot-unplug removes the entry; the kernel numbers a new one's inode anew, cyclically), so a
# monitor reading every round reads each such entry's vendor once instead of every round (on a VM, every function
# is one). The inode comes with the directory listing: no call per entry.
_OTHER_VENDORS: set[tuple[str, int]] = set()
_MAX_KNOWN = 4096


def read_pci_functions(root: Path, notes: list[str]) -> list[PciFunction]:
    """Accelerator PCI functions (Google, NVIDIA, AMD) under root's sysfs, by address.

    Returns [] when there is no PCI tree; a function with unreadable ids is skipped with a line in `notes`.
    Never raises for what it reads.
    """
    base = root / "sys/bus/pci/devices"
    try:
        with os.scandir(base) as listing:
            entries = sorted((entry.name, entry.inode()) for entry in listing)
    except OSError:
        return []
    functions = []
    for address, identity in entries:
        directory = base / address
        known = (str(directory), identity)
        if known in _OTHER_VENDORS:
            continue
        vendor = _read_hex(directory / "vendor")
        if vendor not in (GOOGLE, NVIDIA, AMD):  # most functions: read once, then known by their entry
            if vendor is not None:
                if len(_OTHER_VENDORS) >= _MAX_KNOWN:
                    _OTHER_VENDORS.clear()
                _OTHER_VENDORS.add(known)
            continue
        device, pci_class = _read_hex(directory / "device"), _read_hex(directory / "class")
        if device is None or pci_class is None:
            notes.append(f"PCI function {address}: vendor, device or class unreadable or malformed; skipped")
            continue
        numa = _read_int(directory / "numa_node")
        group = _link_name(directory / "iommu_group")
        functions.append(PciFunction(
            address=address,
            vendor_id=vendor,
            device_id=device,
            subsystem_device_id=_read_hex(directory / "subsystem_device"),
            class_id=pci_class >> 8,
            numa_node=numa if numa is not None and numa >= 0 else None,
            cpu_affinity=_read_text(directory / "local_cpulist"),
            iommu_group=int(group) if group and group.isdigit() else None,
        ))
    return functions


def _spec_for(function: PciFunction) -> ChipSpec | None:
    if function.vendor_id == GOOGLE:
        spec = tpu_spec_for_pci(function.device_id, function.subsystem_device_id)
        if spec is None and function.class_id == _PROCESSING_ACCELERATOR_CLASS:
            return ChipSpec(f"Google accelerator 0x{function.device_id:04x}", "google", "tpu")
        return spec
    if function.vendor_id == NVIDIA and function.class_id in NVIDIA_GPU_CLASSES:
        return gpu_spec_for_pci(function.vendor_id, function.device_id) or generic_gpu_spec("nvidia")
    if function.vendor_id == AMD and function.class_id in AMD_GPU_CLASSES:
        return generic_gpu_spec("amd")
    return None


def _chip_key(address: str) -> str:
    return address.rsplit(".", 1)[0]  # several functions of one chip share domain:bus:device


def group_chips(functions: list[PciFunction]) -> list[tuple[ChipSpec, list[PciFunction]]]:
    """PCI functions grouped into chips (the functions of one slot are one chip), each with its spec.

    Functions of unknown ids are dropped.
    """
    groups: dict[str, tuple[ChipSpec, list[PciFunction]]] = {}
    for function in functions:
        spec = _spec_for(function)
        if spec is None:
            continue
        key = _chip_key(function.address)
        if key in groups:
            groups[key][1].append(function)
        else:
            groups[key] = (spec, [function])
    return list(groups.values())


# --- device nodes ----------------------------------------------------------------------------------

def _node(root: Path, path: str) -> DeviceNode:
    try:
        st = os.stat(root / path.lstrip("/"))
    except OSError:
        return DeviceNode(path=path, exists=False)
    return DeviceNode(path=path, exists=True, mode=f"{st.st_mode & 0o7777:04o}", uid=st.st_uid, gid=st.st_gid)


def _numbered_children(directory: Path, prefix: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((n for n in names if re.fullmatch(rf"{prefix}\d+", n)), key=lambda n: int(n[len(prefix):]))


def _nvidia_information(root: Path, address: str) -> dict[str, str]:
    """The driver's `Key: value` lines of one GPU (/proc/driver/nvidia/gpus/ADDRESS/information); {} without them."""
    text = _read_text(root / "proc/driver/nvidia/gpus" / address / "information") or ""
    return {key.strip(): value.strip() for key, sep, value in (line.partition(":") for line in text.splitlines())
            if sep and key.strip()}


def _nvidia_model(root: Path, address: str) -> str | None:
    """The driver's name of the card ("NVIDIA H100 80GB HBM3"), as nvidia-smi shows it; None without the driver."""
    return _nvidia_information(root, address).get("Model") or None


def _nvidia_minor(root: Path, address: str) -> int | None:
    minor = _nvidia_information(root, address).get("Device Minor", "")
    return int(minor) if minor.isascii() and minor.isdigit() else None


def _node_paths(root: Path, spec: ChipSpec, function: PciFunction, ordinal: int) -> list[str]:
    """Device node paths of one chip; `ordinal` is its index among chips of its kind."""
    directory = root / "sys/bus/pci/devices" / function.address
    if spec.vendor == "google":
        if spec.node_style == "vfio" or (spec.node_style is None and function.iommu_group is not None):
            return [f"/dev/vfio/{function.iommu_group}"] if function.iommu_group is not None else []
        names = _numbered_children(directory / "accel", "accel")
        return [f"/dev/{n}" for n in names] or [f"/dev/accel{ordinal}"]
    if spec.vendor == "nvidia":
        minor = _nvidia_minor(root, function.address)
        return [f"/dev/nvidia{minor if minor is not None else ordinal}"]
    names = _numbered_children(directory / "drm", "renderD")
    return [f"/dev/dri/{n}" for n in names] or [f"/dev/dri/renderD{128 + ordinal}"]


# --- holders ---------------------------------------------------------------------------------------

class _Users:
    """uid -> user name, from the fixture's /etc/passwd or the system's."""

    def __init__(self, root: Path):
        self._names: dict[int, str] = {}
        self._root = root

    def name(self, uid: int | None) -> str:
        if uid is None:
            return "?"
        if uid not in self._names:
            self._names[uid] = self._lookup(uid)
        return self._names[uid]

    def _lookup(self, uid: int) -> str:
        if self._root != Path("/"):
            for line in (_read_text(self._root / "etc/passwd") or "").splitlines():
                parts = line.split(":")
                if len(parts) > 2 and parts[2] == str(uid):
                    return parts[0]
            return str(uid)
        try:
            import pwd

            return pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            return str(uid)


def _process_identity(proc: Path, users: _Users) -> tuple[str, str]:
    status = _read_text(proc / "status") or ""
    match = re.search(r"^Uid:\s*(\d+)", status, re.MULTILINE)
    user = users.name(int(match.group(1)) if match else None)
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        raw = b""
    command = " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p)
    if not command:
        comm = _read_text(proc / "comm")
        command = f"[{comm}]" if comm else "?"
    return user, command


# The programs of this toolkit that only look at devices: opening a node to ask the driver (NVML opens
# /dev/nvidia*) is not holding the device. tpu-bench, tpu-profile, tpu-diag and the agent's jobs run work.
OBSERVERS = ("tpu-ls", "tpu-monitor", "tpu-top", "tpu-dump")
_OBSERVER_SUBCOMMANDS = tuple(name.removeprefix("tpu-") for name in OBSERVERS)


def is_observer(command: str) -> bool:
    """True for a command line of one of the toolkit's observing programs (`tpu-monitor ...`,
    `python3 /usr/bin/tpu-top`, `tpu-tools ls`, `python -m tpu_tools monitor`, `python -m tpu_tools.cli.top`)."""
    words = command.split()
    if words and os.path.basename(words[0]).startswith("python"):
        words = words[1:]
        while words and words[0].startswith("-") and words[0] != "-m":  # the interpreter's own flags
            words = words[1:]
    if not words:
        return False
    if words[0] == "-m":
        module, rest = (words[1], words[2:]) if len(words) > 1 else ("", [])
        if module.startswith("tpu_tools.cli."):
            return module.removeprefix("tpu_tools.cli.") in _OBSERVER_SUBCOMMANDS
        return module == "tpu_tools" and bool(rest) and rest[0] in _OBSERVER_SUBCOMMANDS
    program = os.path.basename(words[0])
    if program == "tpu-tools":
        return len(words) > 1 and words[1] in _OBSERVER_SUBCOMMANDS
    return program in OBSERVERS


def scan_holders(root: Path, targets: set[str], notes: list[str]) -> dict[str, list[Holder]]:
    """Map each target path to the processes with an open file descriptor on it, leaving out this process and
    the toolkit's observing programs (`is_observer`): they open device nodes to ask the driver, not to run."""
    held: dict[str, list[Holder]] = {t: [] for t in targets}
    if not targets:
        return held
    users = _Users(root)
    denied = 0
    try:
        pids = [name for name in os.listdir(root / "proc") if name.isdigit()]
    except OSError:
        notes.append("/proc is not readable: device holders are unknown")
        return held
    own = str(os.getpid()) if root.resolve() == Path("/") else None  # a fixture tree's PIDs are not this host's
    for pid in sorted(pids, key=int):
        if pid == own:
            continue
        proc = root / "proc" / pid
        try:
            fds = os.listdir(proc / "fd")
        except PermissionError:
            denied += 1
            continue
        except OSError:  # the process exited while we looked
            continue
        hits = set()
        for fd in fds:
            try:
                target = os.readlink(proc / "fd" / fd)
            except OSError:
                continue
            if target in held:
                hits.add(target)
        if not hits:
            continue
        user, command = _process_identity(proc, users)
        if is_observer(command):
            continue
        for target in sorted(hits):
            held[target].append(Holder(pid=int(pid), user=user, command=command))
    if denied:
        notes.append(f"{denied} processes could not be inspected (run as root to see every holder)")
    return held


# --- putting it together ---------------------------------------------------------------------------

def discover(root: Path | None = None) -> Discovery:
    """Passive discovery under `root` (default `sysroot()`): chips, their device nodes and the processes holding them.

    Opens nothing and imports no runtime; what cannot be read is skipped, with a note in
    `Discovery.notes` where it matters.
    """
    root = root or sysroot()
    result = Discovery()
    ordinals: dict[str, int] = {}
    shared: set[str] = set()
    for spec, functions in group_chips(read_pci_functions(root, result.notes)):
        first = functions[0]
        family = f"{spec.vendor}/{spec.node_style}"
        ordinal = ordinals.get(family, 0)
        ordinals[family] = ordinal + 1
        result.chips.append(Chip(
            index=len(result.chips),
            name=(_nvidia_model(root, first.address) or spec.name) if spec.vendor == "nvidia" else spec.name,
            vendor=spec.vendor,
            platform=spec.platform,
            pci_address=first.address,
            pci_functions=[f.address for f in functions],
            numa_node=first.numa_node,
            cpu_affinity=first.cpu_affinity,
            iommu_group=first.iommu_group,
            devices_per_chip=spec.devices_per_chip,
            cores_per_chip=spec.cores_per_chip,
            hbm_bytes=spec.hbm_bytes,
            device_nodes=[_node(root, p) for p in _node_paths(root, spec, first, ordinal)],
        ))
        shared.update(_SHARED_NODES.get(spec.vendor, ()))
    result.shared_nodes = [_node(root, p) for p in sorted(shared)]
    for chip in result.chips:
        for node in chip.device_nodes:
            if not node.exists:
                result.notes.append(f"{chip.name} at {chip.pci_address}: device node {node.path} is missing "
                                    "(is the driver loaded?)")
    targets = {n.path for c in result.chips for n in c.device_nodes} | {n.path for n in result.shared_nodes}
    has_tpu = any(c.platform == "tpu" for c in result.chips)
    if has_tpu:
        targets.add(LIBTPU_LOCKFILE)
    held = scan_holders(root, targets, result.notes)
    for node in [n for c in result.chips for n in c.device_nodes] + result.shared_nodes:
        node.holders = held.get(node.path, [])
    result.libtpu_lock_holders = held.get(LIBTPU_LOCKFILE, [])
    return result
