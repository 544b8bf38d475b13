"""The pod UID and container ID of a process, from /proc/PID/cgroup.

The kubelet puts each container in a cgroup named after its pod and container, in one of these forms:
    cgroupfs  (v1 or v2): /kubepods/burstable/pod6f2c.../0123abcd...
    systemd:              /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f2c_...slice/
                          cri-containerd-0123abcd....scope   (also crio-, docker-)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodRef:
    pod_uid: str
    container_id: str | None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod of the first kubepods cgroup line, or None for a process outside Kubernetes."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        match = _POD.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        parts = [p for p in path[match.end():].split("/") if p]
        container = None
        if parts:
            found = _CONTAINER.match(parts[-1] if parts[0].endswith(".slice") else parts[0])
            container = found.group(1) if found else None
        return PodRef(uid, container)
    return None


def pod_of(pid: int, root: Path) -> PodRef | None:
    """The pod of process `pid` under the system root `root`; None when outside a pod or unreadable."""
    try:
        text = (root / "proc" / str(pid) / "cgroup").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return parse_cgroup(text)
