"""How much memory a device has free, and how much of it the memory patterns may take."""

from __future__ import annotations

import os
from typing import Any

MIN_WORDS = 1024
WORD_BYTES = 4


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (the CPU platform's devices share the host's memory)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def free_bytes(device: Any, local_devices: int) -> int | None:
    """The device's free memory: its allocator's limit less what is in use, else a share of the host's."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 a platform without memory statistics
        stats = {}
    limit = stats.get("bytes_limit")
    if limit:
        return max(0, int(limit) - int(stats.get("bytes_in_use") or 0))
    available = host_available_bytes()
    return available // max(1, local_devices) if available else None


def pattern_words(free: int | None, fraction: float, fallback_bytes: int = 64 << 20) -> int:
    """32-bit words of one pattern buffer: `fraction` of the free memory (a fixed size when it is unknown)."""
    budget = int(free * fraction) if free else fallback_bytes
    words = budget // WORD_BYTES
    return max(MIN_WORDS, words - words % MIN_WORDS)


def is_out_of_memory(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}".lower()
    return any(mark in text for mark in ("resource_exhausted", "out of memory", "memoryerror",
                                         "failed to allocate", "cannot allocate"))
