"""Text views of `--list-metrics` (one row per metric of every source) and of `--metric NAME` queries."""

from __future__ import annotations

from typing import Any

from tpu_tools.metrics.catalog import MetricCatalog
from tpu_tools.metrics.single import MetricResult
from tpu_tools.render.table import Column, TableData
from tpu_tools.units import MISSING


def catalog_table(catalog: MetricCatalog) -> TableData:
    table = TableData([Column("SOURCE"), Column("METRIC"), Column("STATUS")], title="metrics")
    for source in catalog.sources:
        label = f"{source.kind} {source.source}"
        if source.error is not None:
            table.add_row(label, "-", source.error)
            continue
        if not source.metrics:
            table.add_row(label, "-", "serves no metrics")
        for metric in source.metrics:
            table.add_row(label, metric.name, metric.status)
    return table


def _cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or MISSING
    return str(value)


def metric_table(result: MetricResult) -> TableData:
    """One query's rows; numbers as served (bytes, microseconds, percent: the column names say which)."""
    table = TableData([Column(name.replace("_", " ").upper(), "left" if index < 2 else "right") for index, name in
                       enumerate(result.columns)], title=result.name)
    for row in result.rows:
        table.add_row(*(_cell(value) for value in row))
    return table
