"""TPU metrics only the process that owns the TPU can read: libtpu's SDK monitoring API, in the job.

The agent asks libtpu's SDK (`libtpu.sdk.tpumonitoring`, or `libtpu.sdk.monitoring` in some releases) only
for what the runtime metrics service does not serve: TensorCore utilization, HBM bandwidth utilization, ICI
link health and the throttle score (`IN_JOB_METRICS`). tpu-tools reads every served metric itself, over
gRPC with deadlines; the SDK reads those from the same service and can abort the whole process (SIGABRT) on
an answer it cannot decode, so the agent never asks it for them. A metric whose read failed once is not
asked again in this process. `TPU_TOOLS_AGENT_SDK=0` turns SDK reads off.

Read only where the job has loaded libtpu already (a TPU job): the agent never imports libtpu into a job
that does not use it. Values are bounded; health values stay the SDK's text, parsed and checked by the
readers (`tpu_tools.metrics.tpuhealth`).

The SDK's calls block, on a service the agent does not control and with no deadline of the agent's: they
run in a reader thread of their own, never in the thread that answers monitors. Each request starts a read
(unless one is under way, which it does not wait for, or the latest is younger than a second) and waits for
it briefly; the answer is the latest
complete reading with its age (`read_age_s`), so a slow or hung SDK costs the monitors only freshness.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Any

from tpu_tools.shorten import shorten

NOT_SERVED = "not served by this runtime"
TENSORCORE_UTILIZATION = "tensorcore_util"
SWITCH = "TPU_TOOLS_AGENT_SDK"  # "0": the agent never calls libtpu's SDK
IN_JOB_METRICS = (TENSORCORE_UTILIZATION, "hbm_util", "ici_link_health", "tpu_throttle_score")
_MAX_VALUES = 1024  # per metric: one per core or link of the largest hosts, with room
_MAX_TEXT = 200
_READ_WAIT_S = 0.3  # how long a request waits for the read it started, then answers with the latest reading
# A reading younger than this is given again rather than read anew: the agent publishes up to ten snapshots a
# second (tpu_tools.agent.publish), and the SDK's figures are sampled by libtpu far less often than that.
MIN_READ_INTERVAL_S = 1.0

_failed: dict[str, str] = {}  # metric -> why its read failed: never asked again in this process
_lock = threading.Lock()


def _monitoring_module() -> tuple[Any | None, str | None]:
    """(the SDK's monitoring module, None) or (None, why there is none)."""
    if os.environ.get(SWITCH, "").strip() == "0":
        return None, f"SDK reads turned off ({SWITCH}=0)"
    if "libtpu" not in sys.modules:
        return None, "libtpu is not loaded in this process"
    try:
        from libtpu import sdk  # type: ignore[import-not-found]
    except Exception as error:  # noqa: BLE001 an older libtpu without the SDK, or one that fails to load it
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
        return shorten(text, _MAX_TEXT) or None
    return number if math.isfinite(number) else None


def _metric_names(module: Any) -> list[str]:
    """The in-job metrics this libtpu knows (all of them where it cannot list its catalogue)."""
    lister = getattr(module, "list_supported_metrics", None)
    if not callable(lister):
        return list(IN_JOB_METRICS)
    known = {str(name) for name in list(lister())[:256]}
    return [name for name in IN_JOB_METRICS if name in known]


def _read(module: Any, name: str) -> dict[str, Any]:
    metric = module.get_metric(name)
    data = list(metric.data())
    description = getattr(metric, "description", None)
    description = description() if callable(description) else description
    entry: dict[str, Any] = {"description": shorten(str(description), _MAX_TEXT) if description else None,
                             "values": [_value(item) for item in data[:_MAX_VALUES]]}
    if len(data) > _MAX_VALUES:
        entry["dropped"] = len(data) - _MAX_VALUES
    return entry


def _read_all(module: Any) -> dict[str, Any]:
    """One reading of every in-job metric this libtpu serves (each failed metric is never asked again)."""
    with _lock:  # one read at a time: the failed set is the process's memory of what not to ask
        if "(list)" in _failed:
            return _no_reading(_failed["(list)"])
        try:
            names = _metric_names(module)
        except Exception as error:  # noqa: BLE001 the SDK fails its own ways; the reading says why
            why = f"the SDK could not list its metrics: {type(error).__name__}: {error}"
            _failed["(list)"] = shorten(why, _MAX_TEXT)
            return _no_reading(_failed["(list)"])
        metrics: dict[str, dict[str, Any]] = {}
        for name in names:
            if name in _failed:
                metrics[name] = {"error": shorten(f"not asked again: {_failed[name]}", _MAX_TEXT)}
                continue
            try:
                metrics[name] = _read(module, name)
            except Exception as error:  # noqa: BLE001 one metric that fails costs only itself, and only once
                _failed[name] = shorten(f"{type(error).__name__}: {error}", _MAX_TEXT)
                metrics[name] = {"error": _failed[name]}
    utilization = metrics.get(TENSORCORE_UTILIZATION, {}).get("values")
    cores = None
    if utilization is not None:
        cores = [v if isinstance(v, float) and 0.0 <= v <= 100.0 else None for v in utilization]
    return {"status": "ok", "metrics": metrics, "tensorcore_utilization_percent": cores}


def _no_reading(why: str | None) -> dict[str, Any]:
    """The answer when there are no figures to give, and why."""
    return {"status": why, "metrics": {}, "tensorcore_utilization_percent": None}


class _Reader:
    """The SDK's reads, in a daemon thread; the latest complete reading and when it finished."""

    def __init__(self) -> None:
        self._state = threading.Lock()
        self._latest: dict[str, Any] | None = None
        self._finished_at = 0.0
        self._running: threading.Thread | None = None
        self._started_at = 0.0

    def reading(self, module: Any) -> dict[str, Any]:
        with self._state:
            running = self._running
            fresh = self._latest is not None and time.monotonic() - self._finished_at < MIN_READ_INTERVAL_S
            started_here = running is None and not fresh
            if started_here:
                running = threading.Thread(target=self._read, args=(module,), daemon=True, name="tpu-tools-agent-sdk")
                try:
                    running.start()
                except RuntimeError:  # at the interpreter's exit no thread can start: the latest reading stands
                    running, started_here = None, False
                else:
                    self._running, self._started_at = running, time.monotonic()
        if started_here and running is not None:  # a read that an earlier request started is not waited for again
            running.join(_READ_WAIT_S)
        with self._state:
            latest, finished_at, started_at = self._latest, self._finished_at, self._started_at
        if latest is None and not started_at:
            return _no_reading("libtpu's SDK was not read before the interpreter's exit")
        if latest is None:
            waited = time.monotonic() - started_at
            return _no_reading(f"libtpu's SDK has not answered its first read yet ({waited:.1f} s)")
        return {**latest, "read_age_s": round(time.monotonic() - finished_at, 3)}

    def _read(self, module: Any) -> None:
        try:
            latest = _read_all(module)
        except Exception as error:  # noqa: BLE001 never into the job; the next request tries again
            latest = _no_reading(shorten(f"the SDK read failed: {type(error).__name__}: {error}", _MAX_TEXT))
        with self._state:
            self._latest, self._finished_at, self._running = latest, time.monotonic(), None


_reader = _Reader()


def _forget_reader_after_fork() -> None:
    global _reader
    _reader = _Reader()  # the reader thread is not in the child


os.register_at_fork(after_in_child=_forget_reader_after_fork)


def read_sdk_metrics() -> dict[str, Any]:
    """{"status", "metrics": {name: {"description", "values"} or {"error"}}, "tensorcore_utilization_percent",
    "read_age_s"}: the latest complete reading of libtpu's SDK, started by this request or an earlier one."""
    module, why = _monitoring_module()
    if module is None:
        return _no_reading(why)
    return _reader.reading(module)
