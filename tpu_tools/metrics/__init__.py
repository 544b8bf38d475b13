"""Runtime metrics: sources (host, processes, workload agents, libtpu's metrics service), monitor reports and
Prometheus export.

Nothing here prints: every function returns data that the CLI renders.
"""
