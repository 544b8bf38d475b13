"""Turn a back-to-back measurement into a case's figures: time per call and rates, with their spread."""

from __future__ import annotations

from tpu_tools.bench.records import CaseResult
from tpu_tools.bench.stats import rates, summarize_bursts
from tpu_tools.bench.timing import Measurement


def record_times(result: CaseResult, measurement: Measurement, figure: str, scale: float,
                 headline: bool = True) -> None:
    """`figure` (time_us: scale 1e6) from the seconds per call, and how they were measured.

    `headline`: the measurement behind the case's primary figure, whose timing values (and repeat spread,
    which flags a case noisy) the case records; a secondary figure only adds its stats.
    """
    result.stats[figure] = summarize_bursts([s * scale for s in measurement.seconds],
                                            [s * scale for s in measurement.burst_medians])
    if headline:
        result.values.update(measurement.values())
    for note in measurement.notes:
        result.warn(note)


def record_rate(result: CaseResult, measurement: Measurement, figure: str, work: float, scale: float) -> None:
    """`figure` (throughput_tflops: work in FLOPs, scale 1e-12) as work per second of each call."""
    result.stats[figure] = summarize_bursts([r * scale for r in rates(work, measurement.seconds)],
                                            [r * scale for r in rates(work, measurement.burst_medians)],
                                            higher_is_better=True)
