"""A job's goodput figures in the processes group, with the monitor's price where the job has none.

The agent serves `goodput` (`tpu_tools.agent.goodput`, decoded into `records.agent.Goodput`); a monitor
may know the price per hour of the machine when the job does not (`tpu-monitor --price-per-hour`),
and then fills in the cost per 1M samples. Unknown stays None, never 0.
"""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.agent import Goodput, GoodputSpan
from tpu_tools.metrics.records.jobs import EntryGoodput


def _priced(span: GoodputSpan | None, price_per_hour: float) -> GoodputSpan | None:
    if span is None:
        return None
    rate = span.samples_per_s
    cost = price_per_hour / 3600.0 / rate * 1e6 if rate is not None and rate > 0 else None
    return msgspec.structs.replace(span, cost_per_million_samples=cost)


def goodput_entry(figures: Goodput | None, price_per_hour: float | None = None) -> EntryGoodput | None:
    """The agent's goodput figures for the processes group, with the monitor's price where the job has none."""
    if figures is None:
        return None
    entry = EntryGoodput(**msgspec.structs.asdict(figures))
    if entry.price_per_hour is None and price_per_hour is not None:
        entry.price_per_hour = price_per_hour
        entry.price_source = "monitor"
        entry.since_start = _priced(entry.since_start, price_per_hour)
        entry.recent = _priced(entry.recent, price_per_hour)
    elif entry.price_per_hour is not None:
        entry.price_source = "job"
    return entry
