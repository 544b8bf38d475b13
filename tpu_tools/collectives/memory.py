"""Does a size fit? Refuse it up front rather than exhaust the device or swap the host.

On the CPU platform every device's buffers live in host memory, next to the
host's own copies (the crafted input, the expected result, the fetched one).
On accelerators each device holds its input and output buffers.
"""

from __future__ import annotations

from typing import Any

from tpu_tools.units import format_bytes

HOST_HEADROOM = 0.8  # leave a fifth of what is available to everything else


def shortfall(devices: list[Any], input_bytes: int, output_bytes: int) -> str | None:
    """None when the buffers fit on these (local) devices, else why not, in words."""
    if not devices:
        return None
    if devices[0].platform == "cpu":
        import psutil

        # Device input and output, plus the host's crafted input, expected and fetched copies.
        needed = len(devices) * (2 * input_bytes + 3 * output_bytes)
        available = int(psutil.virtual_memory().available * HOST_HEADROOM)
        if needed > available:
            return (f"needs about {format_bytes(needed)} of host memory for {len(devices)} CPU devices; "
                    f"{format_bytes(available)} is available")
        return None
    for device in devices:
        try:
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 platforms without memory statistics: let the runtime decide
            return None
        limit = stats.get("bytes_limit")
        if limit is None:
            return None
        free = limit - stats.get("bytes_in_use", 0)
        if input_bytes + output_bytes > free:
            return (f"needs {format_bytes(input_bytes + output_bytes)} on device {device.id}; "
                    f"{format_bytes(free)} of its {format_bytes(limit)} is free")
    return None
