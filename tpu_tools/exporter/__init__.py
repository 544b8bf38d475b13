"""The Prometheus exporter: the series of monitor reports, their naming rules, and the /metrics server.

It reads the reports that `tpu_tools.metrics` builds (a source group may export its own families through its
collector's `prometheus(data)` method) and serves them; nothing here samples a host or a job.
"""
