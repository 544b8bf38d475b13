"""The records of a diagnostic run: one `Check` per test and device, the run's `DiagReport`, its verdict.

Statuses, worst first: fail (a wrong bit, a hang, a crash), warn (nondeterminism, a slow device, a
throttled clock), skip (not run, with why: out of memory, one device only, interrupted), pass. A run ended
by a signal has the status `interrupted` whatever its checks found: it proves nothing about what it did
not reach.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "tpu-tools/diag/v1"
PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)
INTERRUPTED = "interrupted"  # a run's status (never a check's): ended by a signal before its end
EXIT_PASSED, EXIT_FAILED, EXIT_WARNED = 0, 1, 3
LEVEL_NAMES = {1: "quick", 2: "medium", 3: "long", 4: "extended"}


@dataclass
class Check:
    """One test on one device (or on a link, or on the whole set of devices: device None)."""

    test: str
    status: str
    why: str = ""
    device: int | None = None
    link: str | None = None  # "3->4": the pair of devices where a collective's wrong value appeared
    process_id: int = 0
    duration_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    iteration: int = 0  # which repeat of the run (--iterations)
    found_at: str | None = None  # kept from an earlier run (its time) that a partial run did not re-run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @property
    def target(self) -> str:
        if self.link is not None:
            return f"link {self.link}"
        return "all" if self.device is None else f"device {self.device}"


@dataclass
class DeviceCoverage:
    """What a run exercised on one device."""

    device: int
    memory_tested_bytes: int = 0
    memory_free_bytes: int | None = None

    @property
    def memory_share(self) -> float | None:
        if not self.memory_free_bytes:
            return None
        return self.memory_tested_bytes / self.memory_free_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "memory_tested_bytes": self.memory_tested_bytes,
                "memory_free_bytes": self.memory_free_bytes, "memory_share": self.memory_share}


@dataclass
class Coverage:
    devices: dict[int, DeviceCoverage] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)

    def device(self, device_id: int) -> DeviceCoverage:
        return self.devices.setdefault(device_id, DeviceCoverage(device_id))

    def add_link(self, link: str) -> None:
        if link not in self.links:
            self.links.append(link)

    def add_dtype(self, dtype: str) -> None:
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [self.devices[k].to_dict() for k in sorted(self.devices)],
                "links": list(self.links), "dtypes": list(self.dtypes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Coverage:
        coverage = cls(links=list(data.get("links") or []), dtypes=list(data.get("dtypes") or []))
        for entry in data.get("devices") or []:
            coverage.devices[int(entry["device"])] = DeviceCoverage(
                int(entry["device"]), int(entry.get("memory_tested_bytes") or 0), entry.get("memory_free_bytes"))
        return coverage


def verdict(checks: list[Check]) -> str:
    """The run's status: fail when any check failed, else warn when any warned, else pass."""
    statuses = {c.status for c in checks}
    if FAIL in statuses:
        return FAIL
    if WARN in statuses:
        return WARN
    return PASS


def exit_code_for(status: str) -> int:
    return {FAIL: EXIT_FAILED, WARN: EXIT_WARNED}.get(status, EXIT_PASSED)


@dataclass
class DiagReport:
    level: int
    time: str  # UTC start, ISO 8601
    host: str
    platform: str | None = None
    device_kind: str | None = None
    device_ids: list[int] = field(default_factory=list)
    process_count: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)
    interrupted: bool = False
    error: str | None = None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    interrupt_exit_code: int | None = None  # 130 or 143 when a signal ended the run
    runtime: dict[str, Any] = field(default_factory=dict)  # what a digest's key names (diag.reference)

    @property
    def status(self) -> str:
        if self.error:
            return FAIL
        if self.interrupted:
            return INTERRUPTED
        return verdict(self.checks)

    @property
    def exit_code(self) -> int:
        if self.interrupt_exit_code is not None:
            return self.interrupt_exit_code
        return exit_code_for(self.status)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "time": self.time, "host": self.host, "level": self.level,
            "level_name": LEVEL_NAMES.get(self.level), "platform": self.platform, "device_kind": self.device_kind,
            "device_ids": list(self.device_ids), "process_count": self.process_count,
            "settings": dict(self.settings), "status": self.status, "exit_code": self.exit_code,
            "interrupted": self.interrupted, "error": self.error, "elapsed_s": round(self.elapsed_s, 3),
            "counts": {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES},
            "checks": [c.to_dict() for c in self.checks], "coverage": self.coverage.to_dict(),
            "notes": list(self.notes), "runtime": dict(self.runtime),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagReport:
        return cls(
            level=int(data["level"]), time=str(data["time"]), host=str(data.get("host") or ""),
            platform=data.get("platform"), device_kind=data.get("device_kind"),
            device_ids=[int(i) for i in data.get("device_ids") or []],
            process_count=int(data.get("process_count") or 1), settings=dict(data.get("settings") or {}),
            checks=[Check.from_dict(c) for c in data.get("checks") or []],
            coverage=Coverage.from_dict(data.get("coverage") or {}), interrupted=bool(data.get("interrupted")),
            error=data.get("error"), elapsed_s=float(data.get("elapsed_s") or 0.0),
            notes=list(data.get("notes") or []),
            interrupt_exit_code=data.get("exit_code") if data.get("interrupted") else None,
            runtime=dict(data.get("runtime") or {}),
        )
