"""The slow worker of a slice: the host whose figure is furthest from the median of all hosts; and the host
whose tpu-diag GEMM digest differs from the majority of the hosts that ran it under the same key."""

from __future__ import annotations

import statistics
from collections import defaultdict

from tpu_tools.metrics.records.fleet import DigestOutlier, Outlier

# Below these distances from the median a host is not called an outlier: hosts of a healthy slice differ a
# little, and with fewer than three hosts the median cannot tell which one is off.
MIN_HOSTS = 3
UTILIZATION_POINTS = 10.0  # percentage points of the report's utilization_percent (the series' ratio x 100)
STEP_TIME_FRACTION = 0.10  # of the median step time


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


def digest_outliers(digests: dict[str, set[tuple[str, str, str]]]) -> list[DigestOutlier]:
    """`digests`: host -> its (test, key, digest) triples. A host holding a digest that at most half of the
    hosts with the same (test, key) hold is named (as deploy/prometheus/alerts.yml's TpuToolsDiagDigestDiffers)."""
    holders: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for host, triples in digests.items():
        for test, key, digest in triples:
            holders[(test, key)][digest].add(host)
    found = []
    for (test, key), by_digest in sorted(holders.items()):
        hosts = len(set().union(*by_digest.values()))
        for digest, owners in sorted(by_digest.items()):
            if len(owners) * 2 < hosts:
                found += [DigestOutlier(host, test, key, digest, len(owners), hosts) for host in sorted(owners)]
    return found
