"""A job's goodput figures as Prometheus families (the processes group's entry: `metrics/goodput.py`).

Unknown stays None: a series is left out, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tpu_tools.metrics.records.jobs import AgentEntry

_PREFIX = "tpu_tools_"


def goodput_families(agents: list[AgentEntry], labels: list[str],
                     values_of: Callable[[AgentEntry], list[str]]) -> Iterator[Metric]:
    """Prometheus families of the agents' goodput: seconds per cause, and per span goodput, MFU, rates, cost."""
    seconds = CounterMetricFamily(f"{_PREFIX}process_goodput_seconds",
                                  "Wall time of the job since it started, by cause (productive is goodput).",
                                  labels=[*labels, "cause"])
    span_labels = [*labels, "window"]
    ratios = {key: GaugeMetricFamily(f"{_PREFIX}process_{name}", doc, labels=span_labels) for key, name, doc in [
        ("goodput_percent", "goodput_ratio", "Productive share of wall time (window: since_start or recent)."),
        ("mfu_percent", "mfu_ratio", "Model FLOPs per second over the peak of the job's devices."),
    ]}
    gauges = {key: GaugeMetricFamily(f"{_PREFIX}process_{name}", doc, labels=span_labels) for key, name, doc in [
        ("samples_per_s", "samples_per_second", "Samples per second of wall time."),
        ("flops_per_s", "model_flops_per_second", "Model FLOPs per second of wall time."),
        ("cost_per_million_samples", "cost_per_million_samples", "Price of one million samples at the price per hour."),
    ]}
    for agent in agents:
        figures = agent.goodput
        if agent.error or figures is None:
            continue
        values = values_of(agent)
        causes = (figures.since_start.causes_s if figures.since_start is not None else None) or {}
        for cause, value in sorted(causes.items()):
            seconds.add_metric([*values, cause], float(value))  # causes -> seconds: a map from outside
        for span, span_figures in (("since_start", figures.since_start), ("recent", figures.recent)):
            if span_figures is None:
                continue
            for key, family in ratios.items():
                value = getattr(span_figures, key)
                if value is not None:
                    family.add_metric([*values, span], float(value) / 100.0)
            for key, family in gauges.items():
                value = getattr(span_figures, key)
                if value is not None:
                    family.add_metric([*values, span], float(value))
    yield seconds
    yield from ratios.values()
    yield from gauges.values()
    yield from metric_families(agents, labels, values_of)


def metric_families(agents: list[AgentEntry], labels: list[str],
                    values_of: Callable[[AgentEntry], list[str]]) -> Iterator[Metric]:
    """The jobs' own scalars (`tpu_tools.agent.metric`) with their scope and kind, and the step of each."""
    value = GaugeMetricFamily(f"{_PREFIX}process_metric", "A scalar the job published (loss, accuracy), labelled "
                              "with its name, claimed scope and kind (replicated, local, host).",
                              labels=[*labels, "name", "scope", "kind"])
    step = GaugeMetricFamily(f"{_PREFIX}process_metric_step", "The step at which the job published the scalar.",
                             labels=[*labels, "name", "scope"])
    for agent in agents:
        if agent.error:
            continue
        values = values_of(agent)
        for metric in agent.metrics:
            if metric.value is None:
                continue
            scope = metric.scope or ""
            value.add_metric([*values, metric.name, scope, str(metric.kind)], float(metric.value))
            if metric.step is not None:
                step.add_metric([*values, metric.name, scope], float(metric.step))
    yield value
    yield step
