"""A job's own scalars (loss, accuracy) for the monitors, with what kind of value each one really was.

`tpu_tools.agent.metric("loss", loss)` keeps the latest value of each name with the step it was
reported at and its kind, read from the value itself:

- `replicated`: a `jax.Array` replicated on every device of the job (the result of a reduction over
  all of them, or of a computation every device did alike);
- `local`: a `jax.Array` that lives on only some of the job's devices (one device's shard, or a
  replica over this process's devices only): in a job of several devices it is one part's view;
- `host`: a Python or NumPy number: the job computed it on the host, the agent cannot tell how.

A torch_xla tensor is lazy: it is handed to the torch_xla frontend (`tpu_tools.agent.xlametrics`), which
reads its kind from its graph and its value at the job's next `torch_xla.sync()`.

A metric reported with `scope="global"` claims to be the same on every worker. The agent flags
it when its kind says otherwise (`suspect`), and the monitors compare it between the workers of
a job at the same step (`tpu_tools.metrics.global_check`). Nothing here raises into the job: bad
names and values are counted and reported, and at most `MAX_METRICS` names are kept.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tools.instrument.jobvalues import error_text, job_float, job_name
from tpu_tools.shorten import quoted, shorten

MAX_METRICS = 256
MAX_NAME = 128
SCOPES = ("global", "local")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")


@dataclass
class MetricValue:
    name: str
    value: float
    step: int
    scope: str | None
    kind: str  # replicated, local, host
    devices: int | None  # devices the value lives on (None for a host number)
    job_devices: int | None  # devices of the whole job
    time_unix_s: float
    suspect: str | None  # why a metric that claims to be global may not be

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))



def read_value(value: Any) -> tuple[float, str, int | None, int | None]:
    """(number, kind, devices it lives on, devices of the job); raises ValueError for what is not a scalar."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.Array):
        if value.size != 1:
            raise ValueError(f"a metric is one number, not an array of shape {tuple(value.shape)}")
        devices = len(value.sharding.device_set)
        job_devices = int(jax.device_count())
        replicated = bool(value.is_fully_replicated) and devices == job_devices
        data = value if value.is_fully_addressable else value.addressable_data(0)
        number = float(data.reshape(()))
        return number, "replicated" if replicated else "local", devices, job_devices
    if isinstance(value, bool):
        raise ValueError("a metric is a number, not True or False")
    host_number = job_float(value)
    if host_number is None:
        raise ValueError(f"{quoted(value, 40)} is not a number")
    return host_number, "host", None, None


def is_xla_tensor(value: Any) -> bool:
    """A torch tensor on an XLA device: lazy, so reading it here would compile and run its graph."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and isinstance(value, torch.Tensor) and value.device.type == "xla"
    except Exception:  # noqa: BLE001 a tensor subclass whose device cannot be read is not ours to take
        return False


# (name, tensor, scope, step): hands an XLA tensor to the torch_xla frontend, which takes its value once the job
# has run its graph; raises ValueError for what is not one number
DeferXla = Callable[[str, Any, "str | None", int], None]


class MetricStore:
    """The latest value of each metric name; thread-safe; `record` never raises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, MetricValue] = {}
        self.rejected = 0
        self.last_error: str | None = None
        self.defer_xla: DeferXla | None = None  # set by the torch_xla frontend once it is attached

    def record(self, given: Any, value: Any, given_scope: Any, step: int) -> bool:
        problem: str | None
        name = job_name(given)
        scope = job_name(given_scope)
        try:
            if len(self._values) >= MAX_METRICS and name not in self._values:  # before any work: bounded cost
                problem = f"more than {MAX_METRICS} metric names; {quoted(given, 40)} was not kept"
            else:
                problem = self._check(name, given, scope, given_scope)
            if problem is None and name is not None and is_xla_tensor(value):
                if self.defer_xla is None:
                    problem = (f"metric {name}: a torch_xla tensor is taken at the job's next torch_xla.sync, which "
                               "the agent follows once started (python -m tpu_tools.agent); not read here, as that "
                               "would compile and run its graph")
                else:
                    self.defer_xla(name, value, scope, step)
                    return True
            if problem is None and name is not None:
                number, kind, devices, job_devices = read_value(value)
                suspect = None
                if scope == "global" and job_devices is not None and job_devices > 1 and kind != "replicated":
                    suspect = f"claims to be global but lives on {devices} of the job's {job_devices} devices"
                entry = MetricValue(name, number if math.isfinite(number) else math.nan, step, scope, kind, devices,
                                    job_devices, time.time(), suspect)
                if self.keep(entry):
                    return True
                problem = f"more than {MAX_METRICS} metric names; {quoted(name, 40)} was not kept"
        except Exception as error:  # noqa: BLE001 a value that fails to read (a deleted array, a runtime error)
            problem = f"metric {quoted(given, 40)}: {error_text(error)}"
        self.reject(problem or "")
        return False

    def keep(self, entry: MetricValue) -> bool:
        """Keep a value read (here, or by the torch_xla frontend at a step boundary); False when the store is full."""
        with self._lock:
            if entry.name in self._values or len(self._values) < MAX_METRICS:
                self._values[entry.name] = entry
                return True
        return False

    def reject(self, problem: str) -> None:
        """Count a value that could not be kept, with why."""
        with self._lock:
            self.rejected += 1
            self.last_error = shorten(problem, 300)

    @staticmethod
    def _check(name: str | None, given: Any, scope: str | None, given_scope: Any) -> str | None:
        if name is None or not name or len(name) > MAX_NAME or not _NAME.match(name):
            return (f"metric name {quoted(given, 40)} is not a name of letters, digits and _ . : / - (at most "
                    f"{MAX_NAME}, starting with a letter or _)")
        if given_scope is not None and scope not in SCOPES:
            return f"metric {name}: scope {quoted(given_scope, 40)} is not one of {', '.join(SCOPES)}"
        return None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            values = [v.to_dict() for v in self._values.values()]
            rejected, last_error = self.rejected, self.last_error
        for entry in values:  # NaN and infinities are not JSON: the value is unknown
            if not math.isfinite(entry["value"]):
                entry["value"] = None
        return {"values": sorted(values, key=lambda v: v["name"]), "rejected": rejected, "last_error": last_error}


_store = MetricStore()


def process_metrics() -> MetricStore:
    """This process's metrics (a forked child starts with none: `reset_after_fork`)."""
    return _store


def reset_after_fork() -> None:
    global _store
    _store = MetricStore()  # the parent's values are not the child's, and its lock may be held
