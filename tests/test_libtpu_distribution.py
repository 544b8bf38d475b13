"""Percentiles from libtpu's histograms: exponential, linear and explicit buckets, empty ones, bad ones."""

from __future__ import annotations

import pytest
from libtpu_server import distribution, explicit_layout, exponential_layout, linear_layout, spread

from tpu_tools.metrics.libtpu.distribution import (
    NO_SAMPLES,
    Buckets,
    Histogram,
    LayoutError,
    explicit,
    exponential,
    linear,
    merge,
    summarize,
)
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb


def histogram(buckets: Buckets | None, counts: list[int], *, low: float = 0.0, high: float = 0.0,
              count: int | None = None, mean: float = 0.0) -> Histogram:
    return Histogram(count=sum(counts) if count is None else count, mean=mean, min=low, max=high, buckets=buckets,
                     counts=counts)


def test_layouts_reduce_to_bounds():
    assert exponential(3, 2.0, 1.0).bounds == (1.0, 2.0, 4.0, 8.0)
    assert linear(4, 10.0, 5.0).bounds == (5.0, 15.0, 25.0, 35.0, 45.0)
    assert explicit([1, 3, 9]).bounds == (1.0, 3.0, 9.0)
    assert exponential(3, 2.0, 1.0).size == 5  # underflow, 3 finite, overflow


def test_percentiles_interpolate_within_the_bucket_that_holds_the_rank():
    # 10 samples in [2, 4) and 10 in [4, 8); min/max unset (0.0), so the bucket bounds are used as they are.
    summary = summarize(histogram(exponential(3, 2.0, 1.0), [0, 0, 10, 10]))
    assert summary.count == 20
    assert summary.p50 == pytest.approx(4.0)  # rank 10: the top of the [2, 4) bucket
    assert summary.p90 == pytest.approx(4.0 + 4.0 * 0.8)  # rank 18: 8 of 10 into [4, 8)
    assert summary.min is None
    assert summary.max is None  # 0.0 does not agree with the buckets: not trusted


def test_min_and_max_close_the_open_ends_and_clamp_the_percentiles():
    # Everything in the overflow bucket [8, inf): only max can bound it.
    summary = summarize(histogram(exponential(3, 2.0, 1.0), [0, 0, 0, 0, 4], low=9.0, high=13.0))
    assert summary.p50 == pytest.approx(10.5)
    assert summary.p999 <= 13.0  # rank 2 of 4 in [8, max]
    assert (summary.min, summary.max) == (9.0, 13.0)
    # One sample: every percentile is the sample itself.
    single = summarize(histogram(linear(10, 100.0, 0.0), [0, 0, 0, 1], low=250.0, high=250.0, mean=250.0))
    assert single.p50 == single.p99 == single.p999 == 250.0
    assert single.mean == 250.0


def test_an_empty_distribution_is_no_samples_not_a_number():
    assert summarize(histogram(exponential(3, 2.0, 1.0), [])) is NO_SAMPLES
    assert summarize(histogram(exponential(3, 2.0, 1.0), [0, 0, 0])) is NO_SAMPLES
    assert NO_SAMPLES.to_dict() == {"count": 0, "mean": None, "min": None, "max": None, "p50": None, "p90": None,
                                    "p95": None, "p99": None, "p999": None}
    assert not NO_SAMPLES.has_samples


def test_samples_without_a_readable_layout_keep_count_and_mean_only():
    summary = summarize(histogram(None, [3, 4], low=1.0, high=9.0, mean=5.0))
    assert (summary.count, summary.mean, summary.p50) == (7, 5.0, None)


@pytest.mark.parametrize("layout", [exponential_layout(24, 1.5, 10.0), linear_layout(60, 50.0, 0.0),
                                    explicit_layout([100, 500, 800, 900, 1000, 1100, 1200, 1500, 3000])])
def test_percentiles_of_served_histograms_lie_in_the_right_bucket(layout):
    """Histograms built from known samples by the fake service: each percentile within the bucket of the truth."""
    from libtpu_server import layout_bounds

    from tpu_tools.metrics.libtpu.decode import _Reader

    samples = sorted(spread(1000.0, 250.0, 400))
    point = distribution(pb.Attribute(), samples, layout)
    summary = summarize(_Reader({}).histogram("x", point))
    bounds = layout_bounds(layout)
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        truth = samples[int(q * len(samples)) - 1]
        below = max([b for b in bounds if b <= truth], default=samples[0])
        above = min([b for b in bounds if b > truth], default=samples[-1])
        assert below - 1e-9 <= summary.percentile(name) <= above + 1e-9, (name, truth, summary)
    assert summary.min == samples[0]
    assert summary.max == samples[-1]


@pytest.mark.parametrize("make", [lambda: exponential(4, 1.0, 1.0), lambda: exponential(4, 2.0, 0.0),
                                  lambda: linear(3, 0.0, 0.0), lambda: explicit([]),
                                  lambda: explicit([1.0, 1.0, 2.0]), lambda: explicit([3.0, 2.0])])
def test_invalid_layouts_are_refused(make):
    with pytest.raises(LayoutError, match=r"buckets need "):
        make()


def test_counts_that_do_not_fit_the_layout_are_refused():
    with pytest.raises(LayoutError, match="bucket counts"):
        summarize(histogram(exponential(1, 2.0, 1.0), [1, 1, 1, 1]))
    with pytest.raises(LayoutError, match="negative"):
        summarize(histogram(exponential(1, 2.0, 1.0), [1, -1]))


def test_merge_adds_counts_and_refuses_mixed_layouts():
    layout = exponential(3, 2.0, 1.0)
    merged = merge([histogram(layout, [0, 2], low=1.0, high=1.5, mean=1.2),
                    histogram(layout, [0, 0, 0, 2], low=5.0, high=7.0, mean=6.0)])
    assert merged.counts == [0, 2, 0, 2]
    assert merged.count == 4
    assert (merged.min, merged.max, merged.mean) == (1.0, 7.0, pytest.approx(3.6))
    with pytest.raises(LayoutError, match="different bucket layouts"):
        merge([histogram(layout, [1]), histogram(linear(3, 1.0, 0.0), [1])])
