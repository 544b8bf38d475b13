"""NVML's codes in words: clock event (throttle) reasons, compute modes, bus ids, CUDA versions."""

from __future__ import annotations

# nvmlClocksEventReason* bits (nvml.h), in nvidia-smi's order.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU is slowed by heat or by a power limit it should not hit (a finding in a dump).
# sw_power_cap is left out: a busy GPU at its power limit reports it in normal work.
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"hw_slowdown", "hw_power_brake_slowdown"})

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def clock_event_reasons(mask: int) -> list[str]:
    """The reasons set in a mask; bits this table does not know become "unknown_0x...". """
    words = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    if rest:
        words.append(f"unknown_0x{rest:x}")
    return words


def compute_mode(code: int) -> str:
    return COMPUTE_MODES.get(code, f"unknown_{code}")


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" in sysfs form, "0000:18:00.0" (4-digit domain, lower case)."""
    text = nvml_bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def cuda_version(code: int) -> str:
    """CUDA's integer version (13000) as "13.0"."""
    return f"{code // 1000}.{code % 1000 // 10}"
