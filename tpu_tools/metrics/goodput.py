"""A job's goodput figures in the processes group, with the monitor's price where the job has none.

The agent serves `goodput` (`tpu_tools.agent.goodput`, checked by `agent_snapshot`); a monitor
may know the price per hour of the machine when the job does not (`tpu-monitor --price-per-hour`),
and then fills in the cost per 1M samples. Unknown stays None, never 0.
"""

from __future__ import annotations

from typing import Any

SPANS = ("since_start", "recent")


def goodput_entry(snapshot: dict[str, Any], price_per_hour: float | None = None) -> dict[str, Any] | None:
    """The agent's goodput figures for the processes group, with the monitor's price where the job has none."""
    figures = snapshot.get("goodput")
    if not isinstance(figures, dict):
        return None
    entry = {**figures}
    if entry.get("price_per_hour") is None and price_per_hour is not None:
        entry["price_per_hour"] = price_per_hour
        entry["price_source"] = "monitor"
        for span in SPANS:
            figures_of_span = entry.get(span)
            if isinstance(figures_of_span, dict):
                rate = figures_of_span.get("samples_per_s")
                figures_of_span = entry[span] = {**figures_of_span}
                figures_of_span["cost_per_million_samples"] = (price_per_hour / 3600.0 / rate * 1e6
                                                               if isinstance(rate, (int, float)) and rate > 0
                                                               else None)
    elif entry.get("price_per_hour") is not None:
        entry["price_source"] = "job"
    return entry
