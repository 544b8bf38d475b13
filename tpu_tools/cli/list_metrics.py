"""`--list-metrics` (tpu-ls, tpu-monitor) and `--metric NAME` (tpu-ls): ask the sources once, print, exit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_tools.cli.output import Output
from tpu_tools.errors import EXIT_OK
from tpu_tools.exporter.selection import MetricSelection


def list_metrics(metrics_addresses: Sequence[str], metrics_timeout_s: float, agent_timeout_s: float,
                 out: Output, selection: MetricSelection | None = None) -> int:
    """The sources' metrics; with `selection` (tpu-monitor), every family the exporter can serve before them."""
    from tpu_tools.metrics.agent_client import query_agents
    from tpu_tools.metrics.catalog import build_catalog
    from tpu_tools.metrics.groups.processes import agent_entry
    from tpu_tools.metrics.libtpu import read_once
    from tpu_tools.render.catalog_view import catalog_table

    snapshots, _ = read_once(metrics_addresses, metrics_timeout_s)
    agents = [agent_entry(result) for result in query_agents(agent_timeout_s).results]
    catalog = build_catalog(snapshots, agents)
    if out.is_json:
        document = catalog.to_dict()
        if selection is not None:
            from tpu_tools.exporter.families import exported_families

            document = {"schema": document["schema"],
                        "families": [{**info.to_dict(), "served": selection.selects(info.name)}
                                     for info in exported_families()], **document}
        out.json(document)
    else:
        out.table(catalog_table(catalog))
    return EXIT_OK


def query_metrics(requested: Sequence[str], metrics_addresses: Sequence[str], metrics_timeout_s: float,
                  agent_timeout_s: float, out: Output) -> int:
    """`--metric NAME`: each named metric from whichever source serves it; a table each, or one JSON document."""
    from tpu_tools.errors import UsageError
    from tpu_tools.metrics import single
    from tpu_tools.render.catalog_view import metric_table

    try:
        queries = [single.resolve(name) for name in requested]
    except ValueError as error:
        raise UsageError(f"--metric: {error}") from None
    wanted = single.needs(queries)
    sources: dict[str, Any] = {}
    if wanted & {"libtpu", "status"}:
        from tpu_tools.metrics.libtpu import read_once

        sources["snapshots"], statuses = read_once(metrics_addresses, metrics_timeout_s,
                                                   runtime_status="status" in wanted, include_hlo_info=True)
        sources["statuses"] = statuses or []
    if "agents" in wanted:
        from tpu_tools.metrics.agent_client import query_agents
        from tpu_tools.metrics.groups.processes import agent_entry

        sources["agents"] = [agent_entry(result) for result in query_agents(agent_timeout_s).results]
    if "job" in wanted:
        from tpu_tools.metrics.jobexport import read_job_metrics

        sources["endpoints"] = read_job_metrics(metrics_timeout_s)
    results = [single.answer(query, **sources) for query in queries]
    if out.is_json:
        out.json({"schema": single.SCHEMA, "metrics": [r.to_dict() for r in results]})
        return EXIT_OK
    for index, result in enumerate(results):
        if index:
            out.text("")
        out.table(metric_table(result))
        for line in result.notes:
            out.text(f"note: {line}")
    return EXIT_OK
