"""What the device's own sensors say during sustained load.

NVIDIA GPUs: NVML (clocks, heat, power, clock event reasons); a thermal or power slowdown is a warning.
Per GPU, as `dcgmi diag` reports them: the peak temperature, the peak power, the lowest SM clock, and each
throttle reason with the time it was seen (the time between two readings that found it counted whole).
TPU: libtpu's in-process SDK, which only the process that owns the chips can read (tpu-diag does while
it runs): `tpu_throttle_score` (per chip, 0 .. 10 = throttled by 0 .. 100 %) and `ici_link_health` (per
ICI link, 0 healthy .. 10 unusable, with the link's name); any score above 0 is a warning. Other platforms
have no reading; the figures say so. Telemetry never fails a run: a sensor that cannot be read is named.
"""

from __future__ import annotations

import math
import re
import sys
import time
from typing import Any

import msgspec

from tpu_tools.shorten import shorten

THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
TPU_METRICS = ("tpu_throttle_score", "ici_link_health")
SAMPLE_EVERY = 8  # iterations between sensor reads
_MAX_VALUES = 1024
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*%?\s*$")


def score_of(item: Any) -> tuple[str | None, float | None]:
    """(the link or chip named in an SDK value, its score): "tray1.chip0.ici2: 3" -> ("tray1.chip0.ici2", 3.0)."""
    if isinstance(item, bool):
        return None, None
    if isinstance(item, (int, float)):
        return None, float(item) if math.isfinite(item) else None
    text = shorten(str(item).strip(), 200)
    match = _NUMBER.search(text)
    if not match:
        return None, None
    name = text[: match.start()].rstrip(" :=,") or None
    value = float(match.group(1))
    return name, value if math.isfinite(value) else None


class GpuPeaks(msgspec.Struct, kw_only=True):
    """What one GPU's readings reached during sustained load (dcgmi diag's figures)."""

    temperature_peak_celsius: float | None = None
    power_peak_watts: float | None = None
    clock_sm_lowest_hz: float | None = None
    throttle_seconds: dict[str, float] = msgspec.field(default_factory=dict)  # reason -> seconds seen

    def add(self, temperature: float | None, power: float | None, clock: float | None, reasons: list[str],
            seconds: float) -> None:
        if temperature is not None:
            self.temperature_peak_celsius = max(temperature, self.temperature_peak_celsius or temperature)
        if power is not None:
            self.power_peak_watts = max(power, self.power_peak_watts or power)
        if clock is not None:
            self.clock_sm_lowest_hz = min(clock, self.clock_sm_lowest_hz or clock)
        for reason in reasons:
            self.throttle_seconds[reason] = round(self.throttle_seconds.get(reason, 0.0) + seconds, 3)


class WorstScore(msgspec.Struct, kw_only=True):
    where: str  # the chip or ICI link
    score: float  # 0 .. 10


class SustainedTelemetry(msgspec.Struct, kw_only=True):
    """The sensor figures of the sustained test's check (its `figures` hold them with the iterations)."""

    telemetry_source: str | None = None  # "nvml" or "libtpu.sdk"; None when nothing could be read
    telemetry_error: str | None = None
    sensors: dict[str, GpuPeaks] = msgspec.field(default_factory=dict)  # NVML index -> peaks
    tpu_worst: dict[str, WorstScore] = msgspec.field(default_factory=dict)  # SDK metric -> worst score

    @classmethod
    def of(cls, figures: dict[str, Any]) -> SustainedTelemetry:
        """From a sustained check's figures (as this module wrote them)."""
        return msgspec.convert(figures, cls)


class Telemetry:
    def __init__(self, platform: str):
        self.platform = platform
        self.samples = 0
        self.readings = 0
        self.source: str | None = {"cuda": "nvml", "gpu": "nvml", "tpu": "libtpu.sdk"}.get(platform)
        self.error: str | None = None if self.source else "no sensor reading on this platform"
        self.reasons: set[str] = set()
        self.tpu_worst: dict[str, tuple[str, float]] = {}  # metric -> (where, score)
        self.last: dict[str, Any] | None = None
        self.peaks: dict[str, GpuPeaks] = {}  # NVML index -> what its readings reached
        self.read_at: float | None = None

    def sample(self) -> None:
        self.samples += 1
        if self.source is None or self.error or (self.samples - 1) % SAMPLE_EVERY:
            return
        try:
            if self.source == "nvml":
                self._nvml()
            else:
                self._tpu()
        except Exception as error:  # noqa: BLE001 telemetry is a bonus: its failure never fails the run
            self.error = shorten(f"{type(error).__name__}: {error}", 300)

    def _nvml(self) -> None:
        from tpu_tools.metrics.nvml.reader import read_snapshot

        snapshot = read_snapshot(2.0)
        if not snapshot.available:
            self.error = snapshot.error or "NVML is not available"
            return
        reading: dict[str, Any] = {}
        now = time.monotonic()
        since = 0.0 if self.read_at is None else now - self.read_at
        self.read_at = now
        for gpu in snapshot.gpus:
            reading[str(gpu.index)] = {"temperature_celsius": gpu.temperature_celsius,
                                       "power_draw_watts": gpu.power_draw_watts, "clock_sm_hz": gpu.clock_sm_hz}
            throttled = [r for r in gpu.clock_event_reasons or [] if r in THROTTLE_REASONS]
            self.reasons.update(throttled)
            self.peaks.setdefault(str(gpu.index), GpuPeaks()).add(
                gpu.temperature_celsius, gpu.power_draw_watts, gpu.clock_sm_hz, throttled, since)
        self.last = reading
        self.readings += 1

    def _tpu(self) -> None:
        if "libtpu" not in sys.modules:
            self.error = "libtpu is not loaded in this process"
            return
        from libtpu import sdk  # type: ignore[import-not-found]

        monitoring = getattr(sdk, "tpumonitoring", None) or getattr(sdk, "monitoring", None)
        if monitoring is None:
            self.error = "libtpu.sdk has no monitoring API"
            return
        reading: dict[str, Any] = {}
        for metric in TPU_METRICS:
            values = list(monitoring.get_metric(metric).data())[:_MAX_VALUES]
            scores = [score_of(item) for item in values]
            reading[metric] = [score for _, score in scores]
            for position, (where, score) in enumerate(scores):
                if score is None or score <= 0:
                    continue
                label = where or f"{'chip' if metric == 'tpu_throttle_score' else 'link'} {position}"
                if score > self.tpu_worst.get(metric, ("", 0.0))[1]:
                    self.tpu_worst[metric] = (label, score)
        self.last = reading
        self.readings += 1

    def figures(self) -> dict[str, Any]:
        return {"telemetry_source": self.source if not self.error else None, "telemetry_error": self.error,
                "telemetry_samples": self.readings, "telemetry_last": self.last,
                "throttle_reasons": sorted(self.reasons),
                "sensors": {index: msgspec.to_builtins(peaks) for index, peaks in sorted(self.peaks.items())},
                "tpu_worst": {metric: {"where": where, "score": score}
                              for metric, (where, score) in sorted(self.tpu_worst.items())}}

    def warnings(self) -> list[str]:
        found = [f"clocks throttled: {', '.join(sorted(self.reasons))}"] if self.reasons else []
        if "tpu_throttle_score" in self.tpu_worst:
            where, score = self.tpu_worst["tpu_throttle_score"]
            found.append(f"throttled: tpu_throttle_score {score:g} of 10 on {where}")
        if "ici_link_health" in self.tpu_worst:
            where, score = self.tpu_worst["ici_link_health"]
            found.append(f"ICI link {where} unhealthy: ici_link_health {score:g} of 10")
        return found
