"""Text view of `--list-metrics`: one table row per metric of every source."""

from __future__ import annotations

from tpu_tools.metrics.catalog import MetricCatalog
from tpu_tools.render.table import Column, TableData


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
