"""Histograms as libtpu serves them, summarised as percentiles.

A layout is its finite bucket boundaries b0 < b1 < ... < bn: bucket 0 is the underflow bucket
(-inf, b0), bucket i is [b(i-1), b(i)), the last is the overflow bucket [bn, inf). Exponential, linear
and explicit layouts all reduce to that. Percentiles use libtpu's own estimator (its SDK and tpu-info print
the same figures for the same histogram): the target rank is int(samples * q), the bucket is the first whose
cumulative count passes it, and the value is interpolated linearly inside that bucket; below the first
exponential bound the bucket is taken to start at scale / growth_factor, as libtpu does. Where the
distribution's min and max agree with the buckets, they close the open ends and every percentile is clamped
into [min, max] (libtpu's clients can print a p999 above the recorded max). An empty histogram has no
percentiles (None), never a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from tpu_tools.metrics.records.libtpu import Distribution

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))  # tpu-info's, and p99


class LayoutError(ValueError):
    """Bucket options or counts that describe no valid histogram."""


@dataclass(frozen=True)
class Buckets:
    bounds: tuple[float, ...]
    underflow_lower: float | None = None  # where an exponential layout's underflow bucket is taken to start

    @property
    def size(self) -> int:
        """Number of buckets, underflow and overflow included."""
        return len(self.bounds) + 1

    def span(self, index: int) -> tuple[float | None, float | None]:
        """(lower, upper) of a bucket; None for the open end of underflow and overflow."""
        lower = self.bounds[index - 1] if index > 0 else None
        upper = self.bounds[index] if index < len(self.bounds) else None
        return lower, upper


# A layout is a claim by the service: 2**31 buckets would cost gigabytes before a single count is read.
MAX_BUCKETS = 10_000


def _check_count(num_finite_buckets: int) -> None:
    if num_finite_buckets > MAX_BUCKETS:
        raise LayoutError(f"a layout of {num_finite_buckets} buckets is more than the {MAX_BUCKETS} read")


def _finite_bounds(bounds: tuple[float, ...]) -> Buckets:
    if not all(math.isfinite(b) for b in bounds) or any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise LayoutError("the bucket bounds overflow or do not increase")
    return Buckets(bounds)


def exponential(num_finite_buckets: int, growth_factor: float, scale: float) -> Buckets:
    """Bucket bounds scale * growth_factor**i, i = 0..num_finite_buckets. Raises LayoutError for an invalid layout."""
    if num_finite_buckets < 0 or not growth_factor > 1 or not scale > 0 or not math.isfinite(growth_factor * scale):
        raise LayoutError(f"exponential buckets need num_finite_buckets >= 0, growth_factor > 1 and scale > 0 "
                          f"(got {num_finite_buckets}, {growth_factor:g}, {scale:g})")
    _check_count(num_finite_buckets)
    try:
        bounds = _finite_bounds(tuple(scale * growth_factor**i for i in range(num_finite_buckets + 1)))
        return Buckets(bounds.bounds, underflow_lower=scale / growth_factor)
    except OverflowError as error:
        raise LayoutError("the bucket bounds overflow") from error


def linear(num_finite_buckets: int, width: float, offset: float) -> Buckets:
    """Bucket bounds offset + width * i, i = 0..num_finite_buckets. Raises LayoutError for an invalid layout."""
    if num_finite_buckets < 0 or not width > 0 or not math.isfinite(width + offset):
        raise LayoutError(f"linear buckets need num_finite_buckets >= 0 and width > 0 "
                          f"(got {num_finite_buckets}, {width:g})")
    _check_count(num_finite_buckets)
    return _finite_bounds(tuple(offset + width * i for i in range(num_finite_buckets + 1)))


def explicit(bounds: Sequence[float]) -> Buckets:
    """Bucket bounds as given. Raises LayoutError unless they are finite and strictly increasing."""
    _check_count(len(bounds) - 1)
    values = tuple(float(b) for b in bounds)
    if not values or not all(math.isfinite(b) for b in values) or any(b >= a for a, b in
                                                                      zip(values[1:], values)):
        raise LayoutError("explicit buckets need at least one finite bound, strictly increasing")
    return Buckets(values)


@dataclass
class Histogram:
    """One distribution data point as served: the summary fields and the bucket counts."""

    count: int
    mean: float
    min: float
    max: float
    buckets: Buckets | None  # None: a layout tpu-tools cannot read
    counts: list[int]

    def samples(self) -> int:
        return sum(self.counts)


class DistributionSummary(Distribution, kw_only=True):
    """What a consumer shows of a distribution (the report's figures, metrics.records.libtpu), and its buckets."""

    # (upper bound, samples in the bucket) of every bucket of the layout, math.inf for the overflow bucket; empty
    # when the layout cannot be read. Not in the record: the report keeps its percentiles, Prometheus the buckets.
    buckets: tuple[tuple[float, int], ...] = ()

    @property
    def has_samples(self) -> bool:
        return self.count > 0

    def percentile(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    def to_record(self) -> Distribution:
        return Distribution(**{name: getattr(self, name) for name in Distribution.__struct_fields__})

    def to_dict(self) -> dict[str, float | int | None]:
        return msgspec.to_builtins(self.to_record())  # type: ignore[no-any-return]


NO_SAMPLES = DistributionSummary(count=0)


def _check_counts(histogram: Histogram) -> None:
    if any(c < 0 for c in histogram.counts):
        raise LayoutError("negative bucket count")
    if histogram.buckets is not None and len(histogram.counts) > histogram.buckets.size:
        raise LayoutError(f"{len(histogram.counts)} bucket counts for a layout of {histogram.buckets.size} buckets")


def _trusted_extremes(histogram: Histogram) -> tuple[float | None, float | None]:
    """min and max when they agree with the buckets (proto3 cannot tell an unset 0.0 from a real one)."""
    low, high = histogram.min, histogram.max
    if histogram.buckets is None or not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return None, None
    occupied = [i for i, c in enumerate(histogram.counts) if c > 0]
    if not occupied:
        return None, None
    first_upper = histogram.buckets.span(occupied[0])[1]
    last_lower = histogram.buckets.span(occupied[-1])[0]
    if (first_upper is not None and low > first_upper) or (last_lower is not None and high < last_lower):
        return None, None
    return low, high


def percentile(histogram: Histogram, quantile: float) -> float:
    """libtpu's estimate of the value below which `quantile` of the samples lie, clamped into a trusted [min, max]."""
    assert histogram.buckets is not None
    low, high = _trusted_extremes(histogram)
    target = int(histogram.samples() * quantile)  # libtpu's rank: whole samples below the percentile
    cumulative = 0
    for index, count in enumerate(histogram.counts):
        if cumulative + count <= target:
            cumulative += count
            continue
        lower, upper = histogram.buckets.span(index)
        if lower is None:
            lower = histogram.buckets.underflow_lower if histogram.buckets.underflow_lower is not None else low
        lower = lower if lower is not None else upper  # open end and no trusted extreme: the bound itself
        upper = upper if upper is not None else (high if high is not None and lower is not None else lower)
        assert lower is not None and upper is not None
        value = lower + (upper - lower) * ((target - cumulative) / count)
        if low is not None and high is not None:
            value = min(max(value, low), high)
        return value
    raise AssertionError("rank beyond the last sample")


def summarize(histogram: Histogram) -> DistributionSummary:
    """Percentiles p50/p90/p99/p999 and mean/min/max; NO_SAMPLES for an empty histogram.

    Raises LayoutError for counts that do not fit the layout. A histogram with samples but a layout
    that cannot be read keeps count, mean, min and max, and has no percentiles.
    """
    _check_counts(histogram)
    samples = histogram.samples()
    count = max(histogram.count, samples)
    if count <= 0:
        return NO_SAMPLES
    figures: dict[str, float | None] = {name: None for name, _ in PERCENTILES}
    low: float | None = histogram.min
    high: float | None = histogram.max
    buckets: tuple[tuple[float, int], ...] = ()
    if histogram.buckets is not None and samples > 0:
        figures = {name: percentile(histogram, q) for name, q in PERCENTILES}
        low, high = _trusted_extremes(histogram)
        layout = histogram.buckets
        # every bucket of the layout (a service leaves trailing empty ones out): the same bounds on every host
        counts = [*histogram.counts, *[0] * (layout.size - len(histogram.counts))]
        buckets = tuple((_upper(layout, index), count) for index, count in enumerate(counts))
    # a service may send any double: what is not finite (or overflows in between) is not a figure
    finite = {name: value if value is not None and math.isfinite(value) else None for name, value in figures.items()}
    return DistributionSummary(count=count, mean=_finite(histogram.mean), min=_finite(low), max=_finite(high),
                               buckets=buckets, **finite)


def _upper(layout: Buckets, index: int) -> float:
    upper = layout.span(index)[1]
    return math.inf if upper is None else upper


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def merge(histograms: Sequence[Histogram]) -> Histogram:
    """Several data points of one distribution (e.g. per core) as one: counts add up bucket by bucket."""
    if len(histograms) == 1:
        return histograms[0]
    layouts = {h.buckets for h in histograms}
    if len(layouts) != 1:
        raise LayoutError("data points of one distribution use different bucket layouts")
    width = max(len(h.counts) for h in histograms)
    counts = [sum(h.counts[i] for h in histograms if i < len(h.counts)) for i in range(width)]
    total = sum(max(h.count, h.samples()) for h in histograms)
    occupied = [h for h in histograms if max(h.count, h.samples()) > 0]
    mean = (sum(h.mean * max(h.count, h.samples()) for h in occupied) / total) if total else 0.0
    return Histogram(count=total, mean=mean, min=min((h.min for h in occupied), default=0.0),
                     max=max((h.max for h in occupied), default=0.0), buckets=histograms[0].buckets, counts=counts)
