"""Builders of fixture sysfs/dev/proc trees for passive-discovery tests.

Each host is shaped from the public PCI facts (reference/accelerators.md):
vendor/device/subsystem ids, class codes, NUMA nodes, IOMMU groups, device
nodes, and processes whose /proc/<pid>/fd links point at those nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

GOOGLE, NVIDIA, AMD = "0x1ae0", "0x10de", "0x1002"


@dataclass
class FakeProcess:
    pid: int
    uid: int
    cmdline: list[str]
    holds: list[str] = field(default_factory=list)  # device node paths
    environ: dict[str, str] = field(default_factory=dict)  # /proc/PID/environ


@dataclass
class FakeFunction:
    address: str
    vendor: str
    device: str
    pci_class: str
    subsystem: str = "0x0000"
    numa: int = 0
    cpulist: str = "0-23"
    iommu_group: int | None = None
    accel_index: int | None = None  # /sys/.../accel/accelN for /dev/accel style
    render_index: int | None = None  # AMD /sys/.../drm/renderDN


class HostBuilder:
    def __init__(self, root: Path):
        self.root = root
        (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (root / "sys/kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "proc").mkdir(parents=True, exist_ok=True)
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n"
                                         "bob:x:1001:1001::/home/bob:/bin/sh\n")

    def function(self, fn: FakeFunction) -> FakeFunction:
        directory = self.root / "sys/bus/pci/devices" / fn.address
        directory.mkdir(parents=True)
        for name, value in (("vendor", fn.vendor), ("device", fn.device), ("class", fn.pci_class),
                            ("subsystem_device", fn.subsystem), ("numa_node", str(fn.numa)),
                            ("local_cpulist", fn.cpulist)):
            (directory / name).write_text(value + "\n")
        if fn.iommu_group is not None:
            group = self.root / "sys/kernel/iommu_groups" / str(fn.iommu_group)
            group.mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../kernel/iommu_groups/{fn.iommu_group}", directory / "iommu_group")
        if fn.accel_index is not None:
            (directory / "accel" / f"accel{fn.accel_index}").mkdir(parents=True)
        if fn.render_index is not None:
            (directory / "drm" / f"renderD{fn.render_index}").mkdir(parents=True)
        return fn

    def node(self, path: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")
        os.chmod(target, 0o660)

    def process(self, proc: FakeProcess) -> None:
        directory = self.root / "proc" / str(proc.pid)
        (directory / "fd").mkdir(parents=True)
        (directory / "status").write_text(f"Name:\t{proc.cmdline[0]}\nUid:\t{proc.uid}\t{proc.uid}\t{proc.uid}\t"
                                          f"{proc.uid}\n")
        (directory / "cmdline").write_bytes(b"\0".join(a.encode() for a in proc.cmdline) + b"\0")
        (directory / "comm").write_text(proc.cmdline[0][:15] + "\n")
        (directory / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in proc.environ.items()))
        os.symlink("/dev/null", directory / "fd" / "0")
        for i, path in enumerate(proc.holds, start=3):
            os.symlink(path, directory / "fd" / str(i))


def tpu_host(root: Path, device: str, count: int, *, style: str, subsystem: str = "0x0000",
             groups: list[int] | None = None, holders: dict[int, list[int]] | None = None,
             numa_split: bool = True, lockfile_pid: int | None = None) -> HostBuilder:
    """A TPU host: `count` chips; holders maps pid -> chip indexes held."""
    host = HostBuilder(root)
    nodes = []
    for i in range(count):
        group = groups[i] if groups else None
        fn = FakeFunction(address=f"0000:00:{4 + i:02x}.0", vendor=GOOGLE, device=device, pci_class="0x120000",
                          subsystem=subsystem, numa=(i * 2 // count) if numa_split else 0,
                          cpulist="0-111" if not numa_split else ("0-55" if i * 2 < count else "56-111"),
                          iommu_group=group if style == "vfio" else None,
                          accel_index=i if style == "accel" else None)
        host.function(fn)
        node = f"/dev/accel{i}" if style == "accel" else f"/dev/vfio/{group}"
        host.node(node)
        nodes.append(node)
    if style == "vfio":
        host.node("/dev/vfio/vfio")
    for pid, chips in (holders or {}).items():
        host.process(FakeProcess(pid, 1000, ["/usr/bin/python3", "train.py", "--steps", "100"],
                                 [nodes[c] for c in chips]))
    if lockfile_pid is not None:
        host.process(FakeProcess(lockfile_pid, 1001, ["python3", "serve.py"], ["/tmp/libtpu_lockfile"]))
    host.process(FakeProcess(1, 0, ["/sbin/init"]))
    return host


def v4_host(root: Path, holders: dict[int, list[int]] | None = None) -> HostBuilder:
    return tpu_host(root, "0x005e", 4, style="accel", holders=holders)


V5E_GROUPS = [16, 17, 18, 19, 36, 37, 38, 39]


def v5e_host(root: Path, holders: dict[int, list[int]] | None = None) -> HostBuilder:
    return tpu_host(root, "0x0063", 8, style="vfio", groups=V5E_GROUPS, holders=holders)


def v6e_host(root: Path, holders: dict[int, list[int]] | None = None) -> HostBuilder:
    return tpu_host(root, "0x006f", 4, style="vfio", groups=[5, 6, 7, 8], holders=holders)


def tpu7x_host(root: Path, holders: dict[int, list[int]] | None = None) -> HostBuilder:
    return tpu_host(root, "0x0076", 4, style="vfio", groups=[100, 101, 102, 103], holders=holders)


def v5p_host(root: Path, holders: dict[int, list[int]] | None = None) -> HostBuilder:
    return tpu_host(root, "0x0062", 4, style="vfio", groups=[20, 21, 22, 23], holders=holders)


GCE_PRODUCT = "Google Compute Engine"

# One worker of a multi-host slice per generation: (host builder, TPU_ACCELERATOR_TYPE, workers, topology).
TPU_VMS = {
    "v4": (v4_host, "v4-32", 4, "2x2x4"),
    "v5e": (v5e_host, "v5litepod-16", 2, "4x4"),
    "v5p": (v5p_host, "v5p-32", 4, "2x2x4"),
    "v6e": (v6e_host, "v6e-16", 4, "4x4"),
    "tpu7x": (tpu7x_host, "tpu7x-32", 4, "2x2x4"),
}


def dmi(root: Path, product: str = GCE_PRODUCT) -> None:
    """The DMI product name a GCE VM (every TPU VM) reports."""
    directory = root / "sys/class/dmi/id"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "product_name").write_text(product + "\n")


def tpu_vm(root: Path, generation: str, worker: int = 1, *,
           holders: dict[int, list[int]] | None = None) -> tuple[HostBuilder, dict[str, str]]:
    """Worker `worker` of a TPU VM slice: the host tree with GCE's DMI files, and the environment a TPU
    workload gets there (TPU_SKIP_MDS_QUERY set, as on GKE: tests never ask a metadata server)."""
    build, accelerator_type, workers, topology = TPU_VMS[generation]
    host = build(root, holders=holders)
    dmi(root)
    hostnames = ",".join(f"t1v-n-{generation}-w-{i}" for i in range(workers))
    environment = {"TPU_ACCELERATOR_TYPE": accelerator_type, "TPU_WORKER_ID": str(worker),
                   "TPU_WORKER_HOSTNAMES": hostnames, "TPU_TOPOLOGY": topology, "TPU_SKIP_MDS_QUERY": "true"}
    return host, environment


def nvidia_host(root: Path, holders: dict[int, list[int]] | None = None, count: int = 2) -> HostBuilder:
    host = HostBuilder(root)
    for i in range(count):
        address = f"0000:{0x18 + i * 0x20:02x}:00.0"
        host.function(FakeFunction(address=address, vendor=NVIDIA, device="0x2330", pci_class="0x030200",
                                   numa=i % 2))
        # the GPU's HDMI audio function shares the slot but is not a GPU
        host.function(FakeFunction(address=address[:-1] + "1", vendor=NVIDIA, device="0x22a3", pci_class="0x040300"))
        info = root / "proc/driver/nvidia/gpus" / address
        info.mkdir(parents=True)
        # Minor numbers deliberately reversed against PCI order.
        (info / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t {count - 1 - i}\n")
        host.node(f"/dev/nvidia{i}")
    host.node("/dev/nvidiactl")
    host.node("/dev/nvidia-uvm")
    for pid, gpus in (holders or {}).items():
        host.process(FakeProcess(pid, 1001, ["python", "-m", "serve"],
                                 [f"/dev/nvidia{g}" for g in gpus] + ["/dev/nvidiactl"]))
    return host


def amd_host(root: Path) -> HostBuilder:
    """Two AMD Instinct MI300X GPUs at the bus ids the fake libamd_smi.so serves (tests/fake_amdsmi)."""
    host = HostBuilder(root)
    for i, address in enumerate(("0000:0c:00.0", "0000:22:00.0")):
        host.function(FakeFunction(address, AMD, "0x74a1", "0x038000", numa=i, render_index=128 + 8 * i))
        host.node(f"/dev/dri/renderD{128 + 8 * i}")
    host.node("/dev/kfd")
    return host


def mixed_host(root: Path) -> HostBuilder:
    """A v5e chip, an NVIDIA GPU and an AMD GPU on one host; a gVNIC from Google that is no accelerator."""
    host = HostBuilder(root)
    host.function(FakeFunction("0000:00:05.0", GOOGLE, "0x0063", "0x120000", iommu_group=42))
    host.node("/dev/vfio/42")
    host.function(FakeFunction("0000:00:06.0", GOOGLE, "0x0042", "0x020000"))  # gVNIC network card
    host.function(FakeFunction("0000:3b:00.0", NVIDIA, "0x20b5", "0x030200", numa=1))
    host.node("/dev/nvidia0")
    host.node("/dev/nvidiactl")
    host.function(FakeFunction("0000:c1:00.0", AMD, "0x740f", "0x038000", numa=1, render_index=128))
    host.node("/dev/dri/renderD128")
    host.node("/dev/kfd")
    host.process(FakeProcess(4242, 1000, ["python3", "mixed.py"], ["/dev/vfio/42", "/dev/nvidia0"]))
    host.process(FakeProcess(4343, 1001, ["rocm-smi"], ["/dev/kfd"]))
    return host


def empty_host(root: Path) -> HostBuilder:
    host = HostBuilder(root)
    host.process(FakeProcess(1, 0, ["/sbin/init"]))
    return host
