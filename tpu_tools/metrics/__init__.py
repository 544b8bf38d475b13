"""Sampling and export of runtime metrics: host, processes, agents, monitor reports, Prometheus.

Nothing here prints: every function returns data that the CLI renders.
"""
