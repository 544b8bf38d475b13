"""In-process TPU monitoring of the libtpu stand-in: the calls tpu-info makes, serving fixture figures.

FAKE_TPU_TENSORCORE_UTIL (comma-separated, one per core; default four cores) sets TensorCore utilization;
FAKE_TPU_ICI_LINK_HEALTH and FAKE_TPU_THROTTLE_SCORE (';'-separated, in the SDK's formats) set the health
metrics. "hbm_capacity_usage" serves numbers, "duty_cycle_pct" strings with a percent sign (as some releases
do): served metrics the agent must never ask for. "hbm_util" raises, so a reader must keep the others.
FAKE_TPU_SDK_CALLS names a file that gets one line per get_metric call. While the file FAKE_TPU_SDK_HANG
names exists, get_metric blocks, as a call to a service that does not answer does.
"""

import os
import time


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


def _listed(variable, default):
    text = os.environ.get(variable, default)
    changed = os.environ.get(variable + "_FILE")  # a file that, once written, holds the values from then on
    if changed and os.path.exists(changed):
        with open(changed) as values:
            text = values.read().strip()
    return [value for value in text.split(";") if value]


def _metrics():
    return {
        "tensorcore_util": _Metric("tensorcore_util", "TensorCore utilization per core, percent", _utilization()),
        "hbm_util": _Metric("hbm_util", "HBM bandwidth utilization per chip",
                            RuntimeError("vbar control agent missing")),
        "ici_link_health": _Metric("ici_link_health", "ICI link health, 0 .. 10", _listed(
            "FAKE_TPU_ICI_LINK_HEALTH", "tray1.chip0.ici0.int: 0;tray1.chip0.ici1.int: 10;tray1.chip1.ici0.int: 7")),
        "tpu_throttle_score": _Metric("tpu_throttle_score", "throttling, 0 .. 10", _listed(
            "FAKE_TPU_THROTTLE_SCORE", "0-0;1-1;2-0;3-6")),
        "duty_cycle_pct": _Metric("duty_cycle_pct", "Duty cycle per chip", ["97.00%", "96.50%"]),
        "hbm_capacity_usage": _Metric("hbm_capacity_usage", "HBM in use per chip, bytes", [12 << 30, 13 << 30]),
    }


def list_supported_metrics():
    return list(_metrics())


def get_metric(name):
    calls = os.environ.get("FAKE_TPU_SDK_CALLS")
    if calls:
        with open(calls, "a") as log:
            log.write(name + "\n")
    hang = os.environ.get("FAKE_TPU_SDK_HANG")
    while hang and os.path.exists(hang):
        time.sleep(0.01)
    metrics = _metrics()
    if name not in metrics:
        raise ValueError(f"unsupported metric {name}")
    return metrics[name]
