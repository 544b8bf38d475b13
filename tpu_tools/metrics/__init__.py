"""Runtime metrics: sources (host, processes, workload agents, libtpu's metrics service) and monitor reports; a
source group may export its own Prometheus families, which `tpu_tools.exporter` serves.

Nothing here prints: every function returns data that the CLI renders.
"""
