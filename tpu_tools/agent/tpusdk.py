"""TPU metrics only the process that owns the TPU can read: libtpu's SDK monitoring API, in the job.

TensorCore utilization (and whatever else a libtpu release serves through `libtpu.sdk.tpumonitoring`, or
`libtpu.sdk.monitoring` in some releases) is not on the runtime metrics service: it is read in-process.
The agent reads it on request and serves it with its snapshot, so monitors show it without opening the
TPU. Read only where the job has loaded libtpu already (a TPU job): the agent never imports libtpu into
a job that does not use it. Values are bounded and checked; a metric that answers with something
unreadable is named as such, and the other metrics are still served.
"""

from __future__ import annotations

import math
import sys
from typing import Any

NOT_SERVED = "not served by this runtime"
TENSORCORE_UTILIZATION = "tensorcore_util"
_MAX_METRICS = 64
_MAX_VALUES = 1024  # per metric: one per core of the largest hosts, with room
_MAX_TEXT = 200


def _monitoring_module() -> tuple[Any | None, str | None]:
    """(the SDK's monitoring module, None) or (None, why there is none)."""
    if "libtpu" not in sys.modules:
        return None, "libtpu is not loaded in this process"
    try:
        from libtpu import sdk  # type: ignore[import-not-found]
    except Exception as error:  # an older libtpu without the SDK, or one that fails to load it
        return None, f"{NOT_SERVED} (libtpu.sdk: {type(error).__name__})"
    module = getattr(sdk, "tpumonitoring", None) or getattr(sdk, "monitoring", None)
    if module is None or not hasattr(module, "get_metric"):
        return None, f"{NOT_SERVED} (libtpu.sdk has no monitoring API)"
    return module, None


def _value(item: Any) -> float | str | None:
    """A number where the item is one (finite), else bounded text; None for nothing usable."""
    if isinstance(item, bool):
        return None
    if isinstance(item, (int, float)):
        return float(item) if math.isfinite(item) else None
    text = str(item).strip()
    try:
        number = float(text.rstrip("%"))
    except ValueError:
        return text[:_MAX_TEXT] or None
    return number if math.isfinite(number) else None


def _metric_names(module: Any) -> list[str]:
    lister = getattr(module, "list_supported_metrics", None)
    names = list(lister()) if callable(lister) else [TENSORCORE_UTILIZATION]
    return [str(name)[:_MAX_TEXT] for name in names[:_MAX_METRICS]]


def read_sdk_metrics() -> dict[str, Any]:
    """{"status", "metrics": {name: {"description", "values"} or {"error"}}, "tensorcore_utilization_percent"}."""
    module, why = _monitoring_module()
    if module is None:
        return {"status": why, "metrics": {}, "tensorcore_utilization_percent": None}
    try:
        names = _metric_names(module)
    except Exception as error:
        return {"status": f"the SDK could not list its metrics: {type(error).__name__}: {error}"[:_MAX_TEXT],
                "metrics": {}, "tensorcore_utilization_percent": None}
    metrics: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            metric = module.get_metric(name)
            data = list(metric.data())[:_MAX_VALUES]
            description = getattr(metric, "description", None)
            description = description() if callable(description) else description
            metrics[name] = {"description": str(description)[:_MAX_TEXT] if description else None,
                             "values": [_value(item) for item in data]}
        except Exception as error:  # one metric that fails costs only itself
            metrics[name] = {"error": f"{type(error).__name__}: {error}"[:_MAX_TEXT]}
    utilization = metrics.get(TENSORCORE_UTILIZATION, {}).get("values")
    cores = None
    if utilization is not None:
        cores = [v if isinstance(v, float) and 0.0 <= v <= 100.0 else None for v in utilization]
    return {"status": "ok", "metrics": metrics, "tensorcore_utilization_percent": cores}
