"""What happened to the hardware during the job, for its job-end record (what `dcgmi stats` gives).

Sampled from the agent's snapshots, at most every SAMPLE_INTERVAL_S, and once
more when the job ends where the interpreter still lets a thread start (else
the last sample stands):

- the GPUs the job's process has a context on (NVML, read in the job; XID
  events counted as they arrive from the job's start): XID events by code, time
  spent with each clock event reason active (the GPU held below its clocks, and
  why; idle is not counted), energy used (the driver's counter at the end less
  at the start), the most device memory the process held;
- TPUs (libtpu's SDK, as the agent reads it): time throttled per device (the
  throttle score's share of each interval), and each change of an ICI link's
  health score;
- every platform: the peak device memory the runtime reports.

A figure the platform does not give is None (unknown), never 0: on CPU all of
them. Nothing here raises into the job.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from tpu_tools.metrics.tpuhealth import health_from_sdk

SAMPLE_INTERVAL_S = 2.0
MAX_LINK_CHANGES = 256
_NOT_THROTTLED = ("gpu_idle", "none")  # clock event reasons that hold no clock down


class HardwareWatch:
    """The job's hardware figures since the agent started; `sample(snapshot)` with each snapshot made."""

    def __init__(self) -> None:
        self._last = 0.0
        self._nvml: Any = None
        self._nvml_absent = False
        self._energy_start: dict[str, float] = {}
        self._energy_now: dict[str, float] = {}
        self._gpu_memory_peak: int | None = None
        self._xid: Counter[str] = Counter()
        self._gpu_throttled: dict[str, float] = {}
        self._gpus_seen = False
        self._tpu_throttled: dict[int, float] = {}
        self._links: dict[str, int] = {}
        self._link_changes: list[dict[str, Any]] = []
        self._tpu_seen = False
        self.error: str | None = None

    def sample(self, snapshot: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < SAMPLE_INTERVAL_S:
            return
        elapsed = now - self._last if self._last else 0.0
        try:
            self._sample_gpus(elapsed)
        except RuntimeError as error:
            if not force:
                self.error = f"{type(error).__name__}: {error}"
            # at the interpreter's exit no thread can start (NVML is read under deadlines, in threads): the
            # figures stand as of the last sample, at most SAMPLE_INTERVAL_S before the end
        except Exception as error:  # noqa: BLE001 never into the job; the record says why
            self.error = f"{type(error).__name__}: {error}"
        try:
            self._sample_tpu(snapshot.get("tpu_sdk"), elapsed)
        except Exception as error:  # noqa: BLE001 never into the job; the record says why
            self.error = f"{type(error).__name__}: {error}"
        self._last = now

    def _sample_gpus(self, elapsed: float) -> None:
        if self._nvml_absent:
            return
        if self._nvml is None:
            from tpu_tools.metrics.nvml.reader import NvmlReader, enabled, library_loadable

            if not enabled() or not library_loadable():
                self._nvml_absent = True
                return
            self._nvml = NvmlReader(watch_events=True)
        read = self._nvml.read(timeout_s=2.0)
        if not read.available or not read.gpus:
            self._nvml_absent = not read.available
            return
        pid = os.getpid()
        mine = [gpu for gpu in read.gpus if any(p.pid == pid for p in gpu.processes)]
        if not mine:  # the job holds no GPU (yet): nothing of theirs is its
            return
        self._gpus_seen = True
        xid: Counter[str] = Counter()
        for gpu in mine:
            key = gpu.uuid or str(gpu.index)
            if gpu.energy_joules is not None:
                self._energy_start.setdefault(key, gpu.energy_joules)
                self._energy_now[key] = gpu.energy_joules
            used = sum(p.gpu_memory_bytes or 0 for p in gpu.processes if p.pid == pid)
            self._gpu_memory_peak = max(self._gpu_memory_peak or 0, used)
            for reason in gpu.clock_event_reasons or []:
                if reason not in _NOT_THROTTLED:
                    self._gpu_throttled[reason] = self._gpu_throttled.get(reason, 0.0) + elapsed
            for code, count in (gpu.xid_errors or {}).items():
                xid[str(code)] += int(count)
        self._xid = xid  # counted by the watcher since the agent started

    def _sample_tpu(self, sdk: Any, elapsed: float) -> None:
        health = health_from_sdk((sdk or {}).get("metrics")) if isinstance(sdk, dict) else None
        if health is None:
            return
        self._tpu_seen = True
        for throttle in health.throttle:
            self._tpu_throttled[throttle.device] = (self._tpu_throttled.get(throttle.device, 0.0)
                                                    + elapsed * throttle.throttled_percent / 100.0)
        for link in health.links:
            before = self._links.get(link.location)
            if before is not None and before != link.score and len(self._link_changes) < MAX_LINK_CHANGES:
                self._link_changes.append({"link": link.location, "from": before, "to": link.score,
                                           "state": link.state, "time_unix_s": round(time.time(), 3)})
            self._links[link.location] = link.score

    def record(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """The job-end figures, after a last sample; None where the platform gives no such figure."""
        self.sample(snapshot, force=True)
        if self._nvml is not None:
            self._nvml.close()
            self._nvml, self._nvml_absent = None, True
        devices = snapshot.get("devices") or []
        peaks = [d["memory_peak_bytes"] for d in devices if d.get("memory_peak_bytes") is not None]
        peak = max([*peaks, *([self._gpu_memory_peak] if self._gpu_memory_peak is not None else [])], default=None)
        energy = ([self._energy_now[k] - self._energy_start[k] for k in self._energy_now]
                  if self._gpus_seen else [])
        return {
            "source": "nvml" if self._gpus_seen else "libtpu_sdk" if self._tpu_seen else None,
            "xid_events": dict(sorted(self._xid.items())) if self._gpus_seen else None,
            "throttled_s": ({k: round(v, 3) for k, v in sorted(self._gpu_throttled.items())} if self._gpus_seen
                            else {f"tpu:{d}": round(v, 3) for d, v in sorted(self._tpu_throttled.items())}
                            if self._tpu_seen else None),
            "energy_joules": round(sum(energy), 3) if energy else None,
            "ici_link_changes": list(self._link_changes) if self._tpu_seen else None,
            "device_memory_peak_bytes": peak,
            "error": self.error,
        }
