"""Timing statistics, bandwidth, and which processes are slow."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

import numpy as np

from tpu_tools.errors import UsageError

_PERCENTILE = re.compile(r"p([0-9]+(?:\.[0-9]+)?)")  # ASCII digits: "p٩٩" is no statistic


def parse_stats(text: str | None) -> list[str]:
    """--stats "p50,p99" -> ["p50", "p99"]; also min and max."""
    if not text:
        return []
    names: list[str] = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        match = _PERCENTILE.fullmatch(part)
        if part not in ("min", "max") and not (match and 0 <= float(match.group(1)) <= 100):
            raise UsageError(f"unknown statistic {part!r} in --stats: use pNN (0-100, e.g. p50,p99), min or max")
        if part not in names:
            names.append(part)
    return names


def summarise(times_us: list[float], stats: list[str]) -> dict[str, float]:
    values = np.asarray(times_us, dtype=np.float64)
    result: dict[str, float] = {}
    for name in stats:
        if name == "min":
            result[name] = float(values.min())
        elif name == "max":
            result[name] = float(values.max())
        else:
            result[name] = float(np.percentile(values, float(name[1:])))
    return result


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """GB/s with GB = 1e9, as nccl-tests counts."""
    return size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0


@dataclass(frozen=True)
class SlowVerdict:
    median_us: float
    slow: dict[int, float]  # process id -> its time over the median (1.25 = 25 % slower)


def slow_processes(times_us: dict[int, float], threshold: float) -> SlowVerdict:
    """Processes slower than the median by more than `threshold` (0.2 = 20 %)."""
    if len(times_us) < 2:
        return SlowVerdict(next(iter(times_us.values()), 0.0), {})
    median = statistics.median(times_us.values())
    slow = {p: t / median for p, t in times_us.items() if median > 0 and t > median * (1 + threshold)}
    return SlowVerdict(median, slow)
