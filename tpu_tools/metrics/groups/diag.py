"""The `diag` group: the last `tpu-diag` result of this host (its verdict per test and device, and its age).

Read from the runtime directory each round (a small file, decoded again only when it changed); no file means
no run yet, which is a note, not an error. Each device's worst status reaches the devices group (and tpu-top)
as the extra figure `diag_status`. Prometheus: tpu_tools_diag_check_status{test, device, link} (0 pass, 1
fail, 2 warn, 3 skip), tpu_tools_diag_failed (1 when the record holds a failure: the last run's, or an earlier
one a partial run did not re-run), tpu_tools_diag_age_seconds (since the last complete run),
tpu_tools_diag_last_run_timestamp_seconds, tpu_tools_diag_level, and tpu_tools_diag_digest_info{test, device,
key, digest} (each GEMM's digest under its comparability key: the fleet's reference, see docs/diag.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpu_tools.metrics.diagstate import STATUS_VALUES, LastDiagReader
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceFigures
from tpu_tools.metrics.records.devices import DeviceExtra
from tpu_tools.metrics.records.diag import DiagGroup as DiagGroupRecord

SOURCE = "diag"


class DiagGroup:
    name = "diag"
    record_type = DiagGroupRecord

    def __init__(self, options: CollectOptions):
        del options
        self._reader = LastDiagReader()  # decodes the file again only when it changed

    def _last(self, context: CollectContext) -> Any:
        return context.memo(self.name, self._reader.read)

    def collect(self, context: CollectContext) -> DiagGroupRecord:
        last = self._last(context)
        if last is None:
            return DiagGroupRecord(notes=["no tpu-diag result on this host yet"])
        if last.error:
            raise ValueError(last.error)
        return DiagGroupRecord(last=last.to_record())

    def device_figures(self, context: CollectContext) -> list[DeviceFigures]:
        last = self._last(context)
        # The CPU platform's devices are no hardware of the devices list: its verdict stays in the group.
        if last is None or last.error or not last.platform or last.platform == "cpu":
            return []
        age = last.age_s()
        return [DeviceFigures(last.platform, device, SOURCE,
                              extra=DeviceExtra(diag_status=status, diag_age_s=None if age is None else round(age)))
                for device, status in sorted(last.device_status().items())]

    def prometheus(self, data: DiagGroupRecord) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        last = data.last
        if last is None or last.error:
            return []
        checks = GaugeMetricFamily("tpu_tools_diag_check_status",
                                   "The last tpu-diag run's verdict per test and device: 0 pass, 1 fail, 2 warn, "
                                   "3 skip.", labels=["test", "device", "link"])
        worst: dict[tuple[str, str, str], int] = {}
        for check in last.checks:
            key = (check.test, "" if check.device is None else str(check.device), check.link or "")
            value = STATUS_VALUES[check.status]
            previous = worst.get(key)
            if previous is None or value == 1 or (value == 2 and previous in (0, 3)):
                worst[key] = value
        for key, value in sorted(worst.items()):
            checks.add_metric(list(key), value)
        families = [checks]
        for name, figure, text in (
                ("tpu_tools_diag_failed", 1 if last.status == "fail" or last.failed_checks else 0,
                 "1 when the last tpu-diag result holds a failure."),
                ("tpu_tools_diag_age_seconds", last.age_s, "Seconds since the last complete tpu-diag run started."),
                ("tpu_tools_diag_last_run_timestamp_seconds", last.time_unix_s,
                 "When the last tpu-diag run started (Unix time)."),
                ("tpu_tools_diag_level", last.level, "Level (-r) of the last tpu-diag run.")):
            if figure is not None:
                families.append(GaugeMetricFamily(name, text, value=figure))
        digests = GaugeMetricFamily("tpu_tools_diag_digest_info",
                                    "The last tpu-diag run's GEMM digest per device under its comparability key "
                                    "(always 1).", labels=["test", "device", "key", "digest"])
        for check in last.checks:
            if check.digest and check.key and check.device is not None and not check.found_at:
                digests.add_metric([check.test, str(check.device), check.key, check.digest], 1)
        families.append(digests)
        return families
