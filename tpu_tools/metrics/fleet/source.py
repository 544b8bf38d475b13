"""The fleet as a report source: `FleetSource.build()` returns a monitor report of every host.

When Prometheus cannot be read, the last good report comes back again with `fleet.stale` true and
`fleet.error` saying why, so a live view keeps its figures and says they are old.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import tpu_tools
from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.fleet.client import PrometheusAPI, parse_url
from tpu_tools.metrics.fleet.records import PREFIX, build_groups
from tpu_tools.metrics.report import SCHEMA, iso_time

SERIES_QUERY = '{__name__=~"' + PREFIX + '.+"}'


class FleetSource:
    def __init__(self, url: str, timeout_s: float = 2.0):
        self.endpoint = parse_url(url)
        self.api = PrometheusAPI(self.endpoint, timeout_s)
        self.sequence = 0
        self._last: dict[str, Any] | None = None
        self._stale_since: float | None = None

    def build(self) -> dict[str, Any]:
        now = time.time()
        started = time.monotonic()
        report: dict[str, Any] = {
            "schema": SCHEMA, "time": iso_time(now), "time_unix_s": round(now, 3),
            "hostname": f"fleet {self.endpoint.shown}", "sequence": self.sequence,
            "tpu_tools_version": tpu_tools.__version__,
        }
        self.sequence += 1
        try:
            series = self.api.query(SERIES_QUERY)
            up = self.api.query("up")
        except RuntimeFailure as error:
            return self._stale(report, str(error), now)
        groups = build_groups(series, up)
        sampled = iso_time(now)
        for group in groups.values():
            group.update({"period_s": None, "sampled_at": sampled})
            group.setdefault("error", None)
        groups["host"]["hostname"] = report["hostname"]
        groups["fleet"].update({"source": self.endpoint.shown, "stale": False, "stale_since": None,
                                "query_time_s": round(time.monotonic() - started, 4)})
        report.update(groups)
        self._last, self._stale_since = report, None
        return report

    def _stale(self, report: dict[str, Any], error: str, now: float) -> dict[str, Any]:
        if self._stale_since is None:
            self._stale_since = now
        if self._last is None:  # nothing to show yet: every group says why
            failed = {"period_s": None, "sampled_at": report["time"], "error": error}
            report.update({name: dict(failed) for name in ("host", "devices", "processes")})
            report["fleet"] = {**failed, "source": self.endpoint.shown, "hosts": [], "hosts_down": [],
                               "outliers": [], "stale": True, "stale_since": iso_time(self._stale_since)}
            return report
        last = copy.deepcopy(self._last)
        last.update({k: report[k] for k in ("time", "time_unix_s", "sequence")})
        last["fleet"].update({"error": error, "stale": True, "stale_since": iso_time(self._stale_since)})
        return last

    def close(self) -> None:
        pass
