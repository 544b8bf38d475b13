"""XID errors as they arrive: NVML's event set, read by a daemon thread for as long as the monitor runs.

Every GPU is registered for critical XID events; the thread waits on the set (a bounded wait, so it
notices `stop`) and counts each event per GPU and XID code, keeping the last one's code and time. Reads
take a copy under a lock, so a storm of events costs the thread's own time, not a scrape's. A driver
that cannot register events (an older one, a GPU that does not support it) leaves `error` set and the
counts empty; nothing raises.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from typing import Any

from tpu_tools.metrics.records.gpu import XidEvent

XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
_NVML_ERROR_TIMEOUT = 10
WAIT_MS = 500
# What an operator needs to know of the XIDs that take a GPU out of service (NVIDIA's XID catalogue).
XID_MEANINGS = {
    13: "graphics engine exception (often the application)",
    31: "GPU memory page fault (often the application)",
    43: "GPU stopped processing (often the application)",
    45: "preemptive cleanup after a fault",
    48: "double-bit ECC error: reset the GPU",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed: reset the GPU",
    74: "NVLink error: check the link and reset the GPU",
    79: "GPU has fallen off the bus: reset or replace it",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: restart the application",
    95: "uncontained ECC error: reset the GPU",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_event(code: int, time_unix_s: float) -> XidEvent:
    """The record of an XID event, with what its code means."""
    return XidEvent(code=code, time_unix_s=round(time_unix_s, 3),
                    description=XID_MEANINGS.get(code, "see NVIDIA's XID catalogue"))


class XidWatcher:
    def __init__(self, nvml: Any, count: int):
        self._nvml = nvml
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, XidEvent] = {}
        self._stop = threading.Event()
        self.error: str | None = None
        self._indices: dict[int | None, int] = {}
        self._set: Any = None
        # Registering asks every GPU, and a fallen one blocks in NVML: all of it in the thread, never the caller.
        self._thread = threading.Thread(target=self._run, args=(count,), name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _register(self, count: int) -> bool:
        nvml = self._nvml
        try:
            self._set = nvml.nvmlEventSetCreate()
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL_ERROR, self._set)
                self._indices[ctypes.cast(handle, ctypes.c_void_p).value] = index
        except (nvml.NVMLError, AttributeError) as error:
            self.error = f"XID events cannot be read: {error}"
            return False
        return True

    def _run(self, count: int) -> None:
        nvml = self._nvml
        if not self._register(count):
            return
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == _NVML_ERROR_TIMEOUT:
                    continue
                self.error = f"reading XID events stopped: {error}"
                return
            if not data.eventType & XID_CRITICAL_ERROR:
                continue
            index = self._indices.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            if index is None:
                continue
            code = int(data.eventData)
            with self._lock:
                self._counts[(index, code)] += 1
                self._last[index] = xid_event(code, time.time())

    def of(self, index: int) -> tuple[dict[str, int], XidEvent | None]:
        """{code: count} of one GPU since the watcher started, and its last event."""
        with self._lock:
            counts = {str(code): n for (gpu, code), n in sorted(self._counts.items()) if gpu == index}
            return counts, self._last.get(index)

    def stop(self) -> bool:
        """Stop reading; False when the thread is still in an NVML call (NVML must not be shut down then)."""
        self._stop.set()
        self._thread.join(timeout=2 * WAIT_MS / 1000)
        return not self._thread.is_alive()
