"""The `diag` group: this host's last `tpu-diag` result, its verdict per test and device and its age."""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.group import GroupRecord


class DiagCheck(msgspec.Struct, kw_only=True):
    """One check of the last run."""

    test: str  # "gemm f32", "memory random", ...
    status: str  # "pass", "fail", "warn" or "skip"
    device: int | None = None
    link: str | None = None
    why: str = ""
    found_at: str | None = None  # an earlier run's failure, kept by a partial run that did not re-run it
    digest: str | None = None  # a GEMM's digest and its comparability key (see diag.reference)
    key: str | None = None


class DiagResult(msgspec.Struct, kw_only=True):
    """The last result as read from the runtime directory; `error` says why the file could not be read."""

    path: str
    error: str | None = None
    time: str | None = None  # when the last run started (ISO 8601)
    time_unix_s: float | None = None
    age_s: float | None = None  # since the last complete run started (a partial run does not make it younger)
    level: int | None = None  # tpu-diag -r
    platform: str | None = None
    status: str | None = None  # the run's verdict, or "interrupted"
    interrupted: bool = False
    failed_checks: int = 0
    complete_time_unix_s: float | None = None  # when the last complete run started (None: none was)
    checks: list[DiagCheck] = msgspec.field(default_factory=list)


class DiagGroup(GroupRecord, kw_only=True):
    last: DiagResult | None = None  # None: no tpu-diag run on this host yet (said in `notes`)
    notes: list[str] = msgspec.field(default_factory=list)
