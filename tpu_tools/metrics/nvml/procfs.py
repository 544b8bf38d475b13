"""Who a GPU process is (user, command line), read from /proc under the sysroot.

Shared by the NVML and amdsmi readers (both get PIDs from their driver and name them the same way); it
lives with the GpuProcess record it fills.
"""

from __future__ import annotations

from pathlib import Path

from tpu_tools.metrics.records.gpu import GpuProcess


def identify_process(process: GpuProcess, sysroot: Path) -> None:
    """User and command line from /proc; a PID missing there lives in another PID namespace."""
    directory = sysroot / "proc" / str(process.pid)
    try:
        raw = (directory / "cmdline").read_bytes()
    except OSError:
        process.visible = directory.exists()
        return
    process.command = " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p) or None
    try:
        status = (directory / "status").read_text()
    except OSError:
        return
    for line in status.splitlines():
        if line.startswith("Uid:") and len(line.split()) > 1:
            process.user = user_name(int(line.split()[1]), sysroot)


def user_name(uid: int, sysroot: Path) -> str:
    try:
        for line in (sysroot / "etc/passwd").read_text().splitlines():
            parts = line.split(":")
            if len(parts) > 2 and parts[2] == str(uid):
                return parts[0]
    except OSError:
        pass
    return str(uid)
