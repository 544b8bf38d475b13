"""Fleet view: the figures of every host, read from a Prometheus server that scrapes the exporters.

`client` speaks Prometheus's HTTP API, `records` turns the scraped series back into the monitor report
that the local collectors build (so tpu-top and tpu-monitor render it unchanged), `outliers` finds the
host furthest from the slice's median, and `source` ties them together and keeps the last good report.
"""
