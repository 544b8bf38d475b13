"""Prometheus series of the TPU health figures the agents read in their jobs (ICI links, throttling).

`tpu_tools_process_ici_link_health{link,tray,chip,port}`: 0 healthy .. 10 unusable, per ICI link, the link's
location as libtpu names it in `link`; `tpu_tools_process_tpu_throttle_score{device}`: 0 .. 10 (10 % steps);
`tpu_tools_process_tpu_health_unreadable_values`: values the agent's SDK read gave in no documented form.
Each carries the process labels of the other process series (pid, tag and the pod's where in Kubernetes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from tpu_tools.exporter.processlabels import process_label_values


def health_families(data: dict[str, Any], labels: list[str]) -> Iterator[Metric]:
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
    for agent in data.get("agents") or []:
        health = (agent.get("tpu_sdk") or {}).get("health") if not agent.get("error") else None
        if not isinstance(health, dict):
            continue
        values = process_label_values(agent, labels)
        for link in health.get("ici_links") or []:
            links.add_metric([*values, str(link["location"]), str(link["tray"]), str(link["chip"]),
                              str(link["port"])], float(link["score"]))
        for device in health.get("throttle") or []:
            throttle.add_metric([*values, str(device["device"])], float(device["score"]))
        unreadable.add_metric(values, float(len(health.get("problems") or [])))
    yield links
    yield throttle
    yield unreadable
