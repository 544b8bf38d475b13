"""Statistics of measured samples: median, spread and percentiles, with the sample count."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on already sorted values."""
    if not sorted_values:
        raise ValueError("no samples")
    position = (len(sorted_values) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    """One measured figure over its samples. `higher_is_better` tells a comparison which way is worse."""

    median: float
    p25: float
    p75: float
    p90: float
    p99: float
    min: float
    max: float
    mean: float
    stdev: float
    count: int
    higher_is_better: bool

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def summarize(samples: Sequence[float], higher_is_better: bool = False) -> Summary:
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(float(s) for s in samples)
    return Summary(
        median=percentile(ordered, 0.5),
        p25=percentile(ordered, 0.25),
        p75=percentile(ordered, 0.75),
        p90=percentile(ordered, 0.90),
        p99=percentile(ordered, 0.99),
        min=ordered[0],
        max=ordered[-1],
        mean=statistics.fmean(ordered),
        stdev=statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        count=len(ordered),
        higher_is_better=higher_is_better,
    )


def rates(work: float, seconds: Sequence[float]) -> list[float]:
    """Per-sample rates (work per second) from per-sample times."""
    return [work / s for s in seconds if s > 0]


def summarize_bursts(samples: Sequence[float], burst_medians: Sequence[float],
                     higher_is_better: bool = False) -> Summary:
    """A summary whose quartiles span at least the bursts' medians.

    Samples taken in one burst agree more closely than separate runs do; a
    comparison that gates on the quartiles must see the run-to-run spread.
    """
    summary = summarize(samples, higher_is_better)
    if len(burst_medians) < 2:
        return summary
    low, high = min(burst_medians), max(burst_medians)
    return replace(summary, p25=min(summary.p25, low), p75=max(summary.p75, high))
