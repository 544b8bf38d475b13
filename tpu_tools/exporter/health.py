"""Prometheus series of the TPU health figures the agents read in their jobs (ICI links, throttling).

`tpu_tools_process_ici_link_health{link,tray,chip,port}`: 0 healthy .. 10 unusable, per ICI link, the link's
location as libtpu names it in `link`; `tpu_tools_process_tpu_throttle_score{device}`: 0 .. 10 (10 % steps);
`tpu_tools_process_tpu_health_unreadable_values`: values the agent's SDK read gave in no documented form.
Each carries the process labels of the other process series (pid, tag and the pod's where in Kubernetes).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from tpu_tools.exporter.processlabels import process_label_values
from tpu_tools.metrics.records.jobs import ProcessesGroup


def health_families(data: ProcessesGroup, labels: list[str]) -> Iterator[Metric]:
    """From the `processes` group: one series per link and per device of every agent that read them."""
    links = GaugeMetricFamily("tpu_tools_process_ici_link_health",
                              "ICI link health read in the job through libtpu's SDK: 0 healthy, 1-5 transient, "
                              "6-9 persistent problem, 10 unusable.", labels=[*labels, "link", "tray", "chip", "port"])
    throttle = GaugeMetricFamily("tpu_tools_process_tpu_throttle_score",
                                 "TPU throttling read in the job through libtpu's SDK: 0 none .. 10 = throttled "
                                 "by 100 %.", labels=[*labels, "device"])
    unreadable = GaugeMetricFamily("tpu_tools_process_tpu_health_unreadable_values",
                                   "Health values from libtpu's SDK in no documented form (reported, not shown).",
                                   labels=labels)
    for agent in data.agents:
        health = agent.tpu_sdk.health if agent.tpu_sdk is not None and not agent.error else None
        if health is None:
            continue
        values = process_label_values(agent, labels)
        for link in health.ici_links:
            links.add_metric([*values, str(link.location), str(link.tray), str(link.chip), str(link.port)],
                             float(link.score or 0))
        for device in health.throttle:
            throttle.add_metric([*values, str(device.device)], float(device.score))
        unreadable.add_metric(values, float(len(health.problems)))
    yield links
    yield throttle
    yield unreadable
