"""In-process TPU monitoring of the libtpu stand-in: the calls tpu-info makes, serving fixture figures.

FAKE_TPU_TENSORCORE_UTIL (comma-separated, one per core; default four cores) sets TensorCore utilization;
"hbm_capacity_usage" serves numbers, "duty_cycle_pct" strings with a percent sign (as some releases do),
and "broken_metric" raises, so a reader must keep the others.
"""

import os


class _Metric:
    def __init__(self, name, description, values):
        self._name, self._description, self._values = name, description, values

    @property
    def description(self):
        return self._description

    def data(self):
        if isinstance(self._values, Exception):
            raise self._values
        return list(self._values)


def _utilization():
    text = os.environ.get("FAKE_TPU_TENSORCORE_UTIL", "91.5,88.0,0.0,47.25")
    return [value.strip() for value in text.split(",") if value.strip()]


def _metrics():
    return {
        "tensorcore_util": _Metric("tensorcore_util", "TensorCore utilization per core, percent", _utilization()),
        "duty_cycle_pct": _Metric("duty_cycle_pct", "Duty cycle per chip", ["97.00%", "96.50%"]),
        "hbm_capacity_usage": _Metric("hbm_capacity_usage", "HBM in use per chip, bytes", [12 << 30, 13 << 30]),
        "broken_metric": _Metric("broken_metric", "fails to read", RuntimeError("vbar control agent missing")),
    }


def list_supported_metrics():
    return list(_metrics())


def get_metric(name):
    metrics = _metrics()
    if name not in metrics:
        raise ValueError(f"unsupported metric {name}")
    return metrics[name]
