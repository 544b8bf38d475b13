"""Host figures: CPU use, memory, swap, load average.

On Linux they are psutil's figures, computed as psutil computes them, from one read of /proc/stat and one of
/proc/meminfo, files kept open and read again from their start (procfs writes their text anew at each read):
psutil's calls for the same figures open and parse /proc/stat twice, /proc/meminfo twice and /proc/vmstat once,
and a monitor samples them every round (tpu-top every second, beside the jobs it watches). Where those files
cannot be read as expected, and off Linux, psutil's own calls give them.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from dataclasses import dataclass

import psutil

from tpu_tools.metrics.records.host import HostRecord

_FIRST_WINDOW_S = 0.25  # the first CPU % needs two readings; later ones use the previous call
_READ_BYTES = 1 << 17  # /proc/stat's interrupt counts run long on large hosts; btime comes after them
_MEMINFO = re.compile(rb"^(MemTotal|MemFree|MemAvailable|SwapTotal|SwapFree):\s+(\d+)", re.MULTILINE)
_BOOT_TIME = re.compile(rb"^btime\s+(\d+)", re.MULTILINE)
# psutil's fields of the cpu line: user nice system idle iowait irq softirq steal guest guest_nice
_IDLE, _IOWAIT, _GUEST, _GUEST_NICE = 3, 4, 8, 9


@dataclass
class _Memory:
    total_bytes: int
    available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int


def cpu_busy_percent(before: list[float], after: list[float]) -> float:
    """The CPU in use between two readings of /proc/stat's cpu line (seconds per field), as psutil.cpu_percent
    computes it: guest time counted once (it is in user time too), idle and I/O wait not busy."""
    deltas = [max(0, now - then) for then, now in zip(before, after)]
    total = sum(deltas)
    if len(deltas) > _GUEST:
        total -= deltas[_GUEST]
    if len(deltas) > _GUEST_NICE:
        total -= deltas[_GUEST_NICE]
    busy = total - deltas[_IDLE]
    if len(deltas) > _IOWAIT:
        busy -= deltas[_IOWAIT]
    try:
        return round(busy / total * 100, 1)
    except ZeroDivisionError:
        return 0.0


class HostSampler:
    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._primed = False
        self._fds: dict[str, int] = {}
        self._last_cpu: list[float] | None = None
        self._ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cpu_fields = 0  # as many as psutil reads of the cpu line (it counts them once, as it starts)
        self._from_proc = sys.platform.startswith("linux")

    def sample(self) -> HostRecord:
        if self._from_proc:
            try:
                return self._sample_proc()
            except (OSError, ValueError, IndexError, KeyError):  # not as expected: psutil from now on
                self.close()
                self._from_proc = False
        return self._sample_psutil()

    def _read(self, name: str) -> bytes:
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = os.open(f"{self._proc}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, _READ_BYTES, 0)

    def _cpu_times(self) -> tuple[list[float], float | None]:
        """/proc/stat's cpu line in seconds, and the boot time (None where it is not in the text read)."""
        if not self._cpu_fields:
            self._cpu_fields = len(psutil.cpu_times()._fields)
        text = self._read("stat")
        values = text[: text.index(b"\n")].split()
        if values[0] != b"cpu":
            raise ValueError("no cpu line first in /proc/stat")
        times = [float(value) / self._ticks_per_s for value in values[1:self._cpu_fields + 1]]
        boot = _BOOT_TIME.search(text)
        return times, float(boot.group(1)) if boot else None

    def _memory(self) -> _Memory:
        found = {name: int(value) * 1024 for name, value in _MEMINFO.findall(self._read("meminfo"))}
        total, available = found[b"MemTotal"], found.get(b"MemAvailable", 0)
        if not available:  # older kernels, or a kernel's zero: psutil estimates it
            memory = psutil.virtual_memory()
            total, available = int(memory.total), int(memory.available)
        elif available > total:
            available = found[b"MemFree"]
        if b"SwapTotal" in found and b"SwapFree" in found:
            swap_total, swap_used = found[b"SwapTotal"], found[b"SwapTotal"] - found[b"SwapFree"]
        else:  # psutil asks sysinfo(2)
            swap = psutil.swap_memory()
            swap_total, swap_used = int(swap.total), int(swap.used)
        return _Memory(total, available, swap_total, swap_used)

    def _sample_proc(self) -> HostRecord:
        if self._last_cpu is None:
            self._last_cpu = self._cpu_times()[0]
            time.sleep(_FIRST_WINDOW_S)
        cpu, boot = self._cpu_times()
        percent = cpu_busy_percent(self._last_cpu, cpu)
        self._last_cpu = cpu
        memory = self._memory()
        return self._record(percent, memory, time.time() - (boot if boot is not None else psutil.boot_time()))

    def _sample_psutil(self) -> HostRecord:
        if not self._primed:
            psutil.cpu_percent(None)
            time.sleep(_FIRST_WINDOW_S)
            self._primed = True
        cpu = psutil.cpu_percent(None)
        virtual, swap = psutil.virtual_memory(), psutil.swap_memory()
        memory = _Memory(int(virtual.total), int(virtual.available), int(swap.total), int(swap.used))
        try:
            uptime = time.time() - psutil.boot_time()
        except Exception:  # noqa: BLE001 psutil fails its own ways where /proc is odd: uptime unknown
            uptime = None
        return self._record(float(cpu), memory, uptime)

    def _record(self, cpu_percent: float, memory: _Memory, uptime_s: float | None) -> HostRecord:
        load: tuple[float, float, float] | tuple[None, None, None]
        try:
            load = os.getloadavg()
        except OSError:
            load = (None, None, None)
        return HostRecord(
            hostname=socket.gethostname(),
            cpu_count=psutil.cpu_count(),
            cpu_percent=float(cpu_percent),
            memory_total_bytes=memory.total_bytes,
            memory_used_bytes=memory.total_bytes - memory.available_bytes,
            memory_available_bytes=memory.available_bytes,
            swap_total_bytes=memory.swap_total_bytes,
            swap_used_bytes=memory.swap_used_bytes,
            load_average_1m=load[0],
            load_average_5m=load[1],
            load_average_15m=load[2],
            uptime_s=uptime_s,
        )

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
