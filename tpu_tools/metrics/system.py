"""Host figures through psutil: CPU use, memory, swap, load average."""

from __future__ import annotations

import os
import socket
import time

import psutil

from tpu_tools.metrics.records.host import HostRecord

_FIRST_WINDOW_S = 0.25  # the first CPU % needs two readings; later ones use the previous call


class HostSampler:
    def __init__(self) -> None:
        self._primed = False

    def sample(self) -> HostRecord:
        if not self._primed:
            psutil.cpu_percent(None)
            time.sleep(_FIRST_WINDOW_S)
            self._primed = True
        cpu = psutil.cpu_percent(None)
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        load: tuple[float, float, float] | tuple[None, None, None]
        try:
            load = os.getloadavg()
        except OSError:
            load = (None, None, None)
        try:
            uptime = time.time() - psutil.boot_time()
        except Exception:  # noqa: BLE001 psutil fails its own ways where /proc is odd: uptime unknown
            uptime = None
        return HostRecord(
            hostname=socket.gethostname(),
            cpu_count=psutil.cpu_count(),
            cpu_percent=float(cpu),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.total - memory.available),
            memory_available_bytes=int(memory.available),
            swap_total_bytes=int(swap.total),
            swap_used_bytes=int(swap.used),
            load_average_1m=load[0],
            load_average_5m=load[1],
            load_average_15m=load[2],
            uptime_s=uptime,
        )
