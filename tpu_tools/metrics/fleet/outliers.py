"""The slow worker of a slice: the host whose figure is furthest from the median of all hosts."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Below these distances from the median a host is not called an outlier: hosts of a healthy slice differ a
# little, and with fewer than three hosts the median cannot tell which one is off.
MIN_HOSTS = 3
UTILIZATION_POINTS = 10.0  # percentage points of the report's utilization_percent (the series' ratio x 100)
STEP_TIME_FRACTION = 0.10  # of the median step time


@dataclass(frozen=True)
class Outlier:
    host: str
    figure: str  # "utilization_percent" or "step_time_s"
    value: float
    median: float

    @property
    def sentence(self) -> str:
        if self.figure == "utilization_percent":
            return f"utilization {self.value:.1f} % vs median {self.median:.1f} %"
        return f"step time {self.value * 1e3:.1f} ms vs median {self.median * 1e3:.1f} ms"


def furthest(values: dict[str, float], figure: str) -> Outlier | None:
    """The host furthest from the median of `values` (host -> figure), if far enough to matter."""
    if len(values) < MIN_HOSTS:
        return None
    median = statistics.median(values.values())
    host, value = max(sorted(values.items()), key=lambda item: abs(item[1] - median))
    distance = abs(value - median)
    if figure == "utilization_percent":
        far = distance >= UTILIZATION_POINTS
    else:
        far = median > 0 and distance >= STEP_TIME_FRACTION * median
    return Outlier(host, figure, value, median) if far else None


def median_of(values: dict[str, float]) -> float | None:
    return statistics.median(values.values()) if values else None
