"""Node metrics of GKE's TPU device plugin: per chip, the duty cycle and HBM of the container using it.

On GKE the TPU device plugin (a DaemonSet of the node) serves Prometheus text, by default on
`localhost:2112/metrics`, with `duty_cycle`, `memory_used` and `memory_total` per accelerator, labelled with
the accelerator id, model and the namespace / pod / container that holds it. It is read where the host
is a Kubernetes node (the pod's environment names a Kubernetes service) or where an address is given
(`TPU_DEVICE_PLUGIN_METRICS_ADDR`), with the metrics deadline; elsewhere nothing is asked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from tpu_tools.metrics.metricspage import PageTooLarge, read_metrics_page, unreachable_reason
from tpu_tools.metrics.records.jobs import PluginAccelerator, PluginRead
from tpu_tools.shorten import shorten

DEFAULT_ADDRESS = "localhost:2112"
ADDRESS_VARIABLE = "TPU_DEVICE_PLUGIN_METRICS_ADDR"
_FIGURES = {"duty_cycle": "duty_cycle_percent", "memory_used": "memory_used_bytes",
            "memory_total": "memory_total_bytes"}
_LABELS = ("model", "make", "namespace", "pod", "container")
_MAX_BYTES = 4 << 20
_MAX_ACCELERATORS = 1024


def plugin_address(environ: Mapping[str, str] | None = None) -> str | None:
    """Where to read, or None where this host is no Kubernetes node and no address is given."""
    env = os.environ if environ is None else environ
    if env.get(ADDRESS_VARIABLE):
        return env[ADDRESS_VARIABLE].strip()
    return DEFAULT_ADDRESS if env.get("KUBERNETES_SERVICE_HOST") else None


def _in_range(figure: str, value: float) -> bool:
    if not math.isfinite(value) or value < 0:
        return False
    return value <= 100.0 if figure == "duty_cycle_percent" else True


def parse(text: str) -> tuple[list[PluginAccelerator], list[str]]:
    """Accelerators from the plugin's exposition; values that are not finite or out of range are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    accelerators: dict[str, PluginAccelerator] = {}
    skipped = 0
    for family in text_string_to_metric_families(text):
        figure = _FIGURES.get(family.name)
        if figure is None:
            continue
        for sample in family.samples:
            identity = sample.labels.get("accelerator_id")
            if not identity or (identity not in accelerators and len(accelerators) >= _MAX_ACCELERATORS):
                skipped += 1
                continue
            entry = accelerators.setdefault(identity, PluginAccelerator(accelerator_id=shorten(identity, 200)))
            for label in _LABELS:
                if sample.labels.get(label):
                    setattr(entry, label, sample.labels[label][:200])
            if _in_range(figure, float(sample.value)):
                setattr(entry, figure, float(sample.value))
            else:
                skipped += 1
    notes = [f"skipped {skipped} samples with no accelerator id or an unreadable value"] if skipped else []
    return [accelerators[key] for key in sorted(accelerators)], notes


def read_plugin(timeout_s: float, environ: Mapping[str, str] | None = None) -> PluginRead:
    address = plugin_address(environ)
    result = PluginRead(address=address)
    if address is None:
        return result
    try:
        text = read_metrics_page(address, timeout_s, _MAX_BYTES)
    except PageTooLarge as error:
        result.error = f"the TPU device plugin at {address} answered {error}"
        return result
    except (OSError, ValueError) as error:
        result.error = f"no TPU device plugin metrics at {address}: {unreachable_reason(error)}"
        return result
    try:
        result.accelerators, result.notes = parse(text)
    except (ValueError, TypeError, IndexError) as error:
        result.error = shorten(f"the TPU device plugin at {address} answered unreadable text: {error}", 300)
    return result
