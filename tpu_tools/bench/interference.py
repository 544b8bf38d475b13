"""What else the host did while a case ran, and whether the case's figures can be trusted ("noisy").

Read around each case: other processes' CPU time (all CPU time less this
process's), the load average, steal time (a hypervisor running other guests on
this machine's CPUs) and the CPU frequency, where the host exposes them; on an NVIDIA GPU, its clocks,
temperature, power and what held its clocks back at the end of the case (gpu_clocks.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from tpu_tools.bench.gpu_clocks import SLOWED_BY_FAULT, slowdown_sentence

# A case is noisy when its bursts' medians differ by more than this (min to max over the median): a figure
# that moves this much within one run cannot be gated at a 5 % tolerance.
NOISY_REPEAT_SPREAD = 0.05
# ... or, on the CPU platform (where the benchmark is host CPU work), when other processes took more than
# this share of the machine's CPU time while the case ran.
NOISY_OTHER_CPU_SHARE = 0.10


@dataclass(frozen=True)
class Snapshot:
    wall: float
    total_busy_s: float | None  # all CPUs, every process
    own_s: float | None  # this process (all its threads) and its children
    steal_s: float | None


def snapshot() -> Snapshot:
    try:
        import psutil

        times = psutil.cpu_times()
        busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))
        own = psutil.Process().cpu_times()
        own_s = own.user + own.system + own.children_user + own.children_system
        steal = getattr(times, "steal", None)
        return Snapshot(time.perf_counter(), busy, own_s, steal)
    except Exception:  # noqa: BLE001 no psutil or no /proc: nothing to report
        return Snapshot(time.perf_counter(), None, None, None)


def interference(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Figures of the host's activity between two snapshots (None where unreadable)."""
    wall = max(after.wall - before.wall, 1e-9)
    cpus = os.cpu_count() or 1
    other = None
    if None not in (before.total_busy_s, after.total_busy_s, before.own_s, after.own_s):
        others = (after.total_busy_s - before.total_busy_s) - (after.own_s - before.own_s)  # type: ignore[operator]
        other = max(0.0, others) / (wall * cpus) * 100
    steal = None
    if before.steal_s is not None and after.steal_s is not None:
        steal = max(0.0, after.steal_s - before.steal_s) / (wall * cpus) * 100
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"other_processes_cpu_percent": other, "steal_percent": steal, "load_average_1m": load,
            "cpu_mhz": _cpu_mhz(), "cpus": cpus}


def _cpu_mhz() -> float | None:
    try:
        import psutil

        frequency = psutil.cpu_freq()
        return float(frequency.current) if frequency and frequency.current else None
    except Exception:  # noqa: BLE001 not readable in many VMs
        return None


def noise_reasons(values: dict[str, Any], platform: str) -> list[str]:
    """Why a case's figures may not repeat, from its values (repeat spread, interference); [] when quiet."""
    reasons = []
    spread = values.get("repeat_spread_percent")
    if spread is not None and spread > NOISY_REPEAT_SPREAD * 100:
        reasons.append(f"its {values.get('repeats')} repeats differ by {spread:.1f}% (min to max of their medians)")
    host = values.get("interference") or {}
    other = host.get("other_processes_cpu_percent")
    if platform == "cpu" and other is not None and other > NOISY_OTHER_CPU_SHARE * 100:
        reasons.append(f"other processes used {other:.0f}% of the host's CPU time while it ran")
    steal = host.get("steal_percent")
    if steal is not None and steal > NOISY_OTHER_CPU_SHARE * 100:
        reasons.append(f"the hypervisor took {steal:.0f}% of the CPU time (steal)")
    gpu = host.get("gpu") or {}
    held_back = slowdown_sentence(gpu)
    # Heat or a power brake make a figure untrustworthy by themselves; the power cap of a busy GPU only
    # explains why its repeats moved.
    if held_back and (reasons or SLOWED_BY_FAULT & set(gpu.get("clock_event_reasons") or ())):
        reasons.append(held_back)
    return reasons
