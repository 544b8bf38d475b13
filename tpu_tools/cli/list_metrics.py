"""`--list-metrics` of tpu-ls and tpu-monitor: ask every source once, print the catalog, exit."""

from __future__ import annotations

from collections.abc import Sequence

from tpu_tools.cli.output import Output
from tpu_tools.errors import EXIT_OK


def list_metrics(metrics_addresses: Sequence[str], metrics_timeout_s: float, agent_timeout_s: float,
                 out: Output) -> int:
    from tpu_tools.metrics.agent_client import query_agents
    from tpu_tools.metrics.catalog import build_catalog
    from tpu_tools.metrics.groups.processes import agent_entry
    from tpu_tools.metrics.libtpu import read_once
    from tpu_tools.render.catalog_view import catalog_table

    snapshots, _ = read_once(metrics_addresses, metrics_timeout_s)
    agents = [agent_entry(result) for result in query_agents(agent_timeout_s).results]
    catalog = build_catalog(snapshots, agents)
    if out.is_json:
        out.json(catalog.to_dict())
    else:
        out.table(catalog_table(catalog))
    return EXIT_OK
