"""Prometheus families from the library-neutral samples a source gives (`metrics/libtpu/export.py`'s
`GaugeSample` and `HistogramSample`): one family per name, for the groups that export their own figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric


def sample_families(samples: Iterable[Any]) -> Iterator[Metric]:
    """Gauge families from library-neutral samples (name, documentation, labels, value), one per name."""
    return _families_by_name(samples, GaugeMetricFamily,
                             lambda family, values, sample: family.add_metric(values, float(sample.value)))


def histogram_families(samples: Iterable[Any]) -> Iterator[Metric]:
    """Histogram families from library-neutral samples (name, documentation, labels, cumulative buckets, sum)."""
    def add(family: Any, values: list[str], sample: Any) -> None:
        buckets = [("+Inf" if upper == math.inf else repr(float(upper)), float(count))
                   for upper, count in sample.buckets]
        family.add_metric(values, buckets, sample.sum)

    return _families_by_name(samples, HistogramMetricFamily, add)


def _families_by_name(samples: Iterable[Any], kind: Callable[..., Metric],
                      add: Callable[[Any, list[str], Any], None]) -> Iterator[Metric]:
    """One family of `kind` per sample name, its labels those of the name's first sample, in order of first use."""
    families: dict[str, tuple[Metric, list[str]]] = {}
    for sample in samples:
        if sample.name not in families:
            labels = list(sample.labels)
            families[sample.name] = (kind(sample.name, sample.documentation, labels=labels), labels)
        family, labels = families[sample.name]
        add(family, [str(sample.labels.get(label, "")) for label in labels], sample)
    for family, _ in families.values():
        yield family
