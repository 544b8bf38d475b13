"""The one SI-prefix formatter (units.format_si) that bench and profile views share."""

from __future__ import annotations

import pytest

from tpu_tools.render.bench_view import format_figure
from tpu_tools.units import format_si


@pytest.mark.parametrize(("value", "unit", "text"), [
    (0, "", "0"), (12, "", "12"), (5720, "", "5.72 k"), (4.31e9, "", "4.31 G"), (306.27e9, "", "306 G"),
    (197e12, "FLOP/s", "197 TFLOP/s"), (819e9, "B/s", "819 GB/s"), (-2500, "B", "-2.5 kB"), (None, "", "-"),
    (999.7, "", "1 k"), (999_999, "", "1 M"),  # rounding up crosses to the next prefix
])
def test_si_prefixes(value, unit, text):
    assert format_si(value, unit) == text


def test_bench_figures_use_the_same_prefixes():
    assert format_figure("throughput_tflops", 0.5) == "500 GFLOP/s"
    assert format_figure("samples_per_s", 5720.0) == "5.72k samples/s"
    assert format_figure("bandwidth_gbps", 1.5) == "1.5 GB/s"
