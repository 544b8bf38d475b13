"""Pod labels for processes: the container that holds a process's devices, and the processes that share
that container.

The pod-resources API says which container holds which device (TPU chips of `google.com/tpu` by index,
GPUs of `nvidia.com/gpu` by UUID or index); discovery says which process holds which chip; the cgroup
says which container a process is in, so the other processes of a container that holds a device (a
launcher, a data loader with the agent) get its labels too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.kube.cgroup import pod_of
from tpu_tools.metrics.kube.podresources import ContainerRef, PodResourcesClient
from tpu_tools.metrics.processfacts import ProcessFacts

# Device-plugin resources per PJRT platform of the chip.
RESOURCES = {"tpu": ("google.com/tpu",), "cuda": ("nvidia.com/gpu",), "rocm": ("amd.com/gpu",)}


def chip_aliases(root: Path, platform: str, pci_address: str) -> tuple[str, ...]:
    """Names a device plugin may give a chip besides its index: its PCI address, and for an NVIDIA GPU the
    UUID the NVIDIA device plugin uses by default (from the driver's /proc/driver/nvidia/gpus/ADDR/information)."""
    aliases = [pci_address]
    if platform == "cuda":
        try:
            text = (root / "proc/driver/nvidia/gpus" / pci_address / "information").read_text()
        except (OSError, UnicodeDecodeError):
            text = ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "GPU UUID" and value.strip():
                aliases.append(value.strip())
    return tuple(aliases)


@dataclass(frozen=True)
class HeldChip:
    """A chip a process holds: its platform, index and the other names a device plugin may use for it."""

    platform: str
    index: int
    aliases: tuple[str, ...] = ()


class PodLabeler:
    def __init__(self, client: PodResourcesClient, root: Path):
        self.client = client
        self.root = root
        self._pods = ProcessFacts(lambda pid: pod_of(pid, root))  # the container of each process, read now and then

    def labels(self, pids: Iterable[int],
               held: dict[int, list[HeldChip]]) -> tuple[dict[int, ContainerRef], str | None]:
        """{pid: container} for the processes found in a pod, and why none could be found (or None)."""
        wanted = sorted(set(pids))
        self._pods.forget_except({*wanted, *held})
        refs = {pid: self._pods.get(pid) for pid in wanted}
        if not any(refs.values()):
            return {}, "no process runs in a Kubernetes pod"
        try:
            owners = self.client.device_owners()
        except RuntimeFailure as error:
            return {}, str(error)
        found: dict[int, ContainerRef] = {}
        by_container: dict[str, ContainerRef] = {}
        for pid, chips in held.items():
            for chip in chips:
                for resource in RESOURCES.get(chip.platform, ()):
                    for name in (str(chip.index), *chip.aliases):
                        owner = owners.get((resource, name))
                        if owner is not None:
                            found[pid] = owner
                            ref = refs.get(pid) or self._pods.get(pid)
                            if ref is not None and ref.container_id:
                                by_container[ref.container_id] = owner
        for pid, ref in refs.items():
            if pid not in found and ref is not None and ref.container_id in by_container:
                found[pid] = by_container[ref.container_id]
        return {pid: found[pid] for pid in wanted if pid in found}, None
