"""What the device's own sensors say during sustained load: NVML on NVIDIA GPUs (clocks, heat, power,
clock event reasons). Other platforms have no reading here; the figures then say so."""

from __future__ import annotations

from typing import Any

THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


class Telemetry:
    def __init__(self, platform: str):
        self.platform = platform
        self.samples: list[dict[str, Any]] = []
        self.source: str | None = None
        self.error: str | None = None
        self.reasons: set[str] = set()
        if platform in ("cuda", "gpu"):
            self.source = "nvml"

    def sample(self) -> None:
        if self.source != "nvml" or self.error or (self.samples and len(self.samples) % 8):
            self.samples.append({})
            return
        from tpu_tools.metrics.nvml.reader import read_snapshot

        try:
            snapshot = read_snapshot(2.0)
        except Exception as error:  # telemetry is a bonus: its failure never fails the run
            self.error = f"{type(error).__name__}: {error}"
            return
        if not snapshot.available:
            self.error = snapshot.error or "NVML is not available"
            return
        reading: dict[str, Any] = {}
        for gpu in snapshot.gpus:
            reading[str(gpu.index)] = {"temperature_celsius": gpu.temperature_celsius,
                                       "power_draw_watts": gpu.power_draw_watts, "clock_sm_hz": gpu.clock_sm_hz}
            self.reasons.update(r for r in gpu.clock_event_reasons or [] if r in THROTTLE_REASONS)
        self.samples.append(reading)

    def figures(self) -> dict[str, Any]:
        readings = [s for s in self.samples if s]
        return {"telemetry_source": self.source if not self.error else None, "telemetry_error": self.error,
                "telemetry_samples": len(readings), "telemetry_last": readings[-1] if readings else None,
                "throttle_reasons": sorted(self.reasons)}

    def warnings(self) -> list[str]:
        return [f"clocks throttled: {', '.join(sorted(self.reasons))}"] if self.reasons else []
