"""What a diagnostic run does: its level, how long level 3 lasts, how much memory it tests, what it injects."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.parsing import parse_number

LEVELS = (1, 2, 3)
DEFAULT_DURATION_S = 15 * 60.0
DEFAULT_MEMORY_FRACTION = 0.02  # of each device's free memory: a bounded share by default
RATE_THRESHOLD = 0.10  # a device this much slower than its peers' median is an outlier
SEED = 20261124
MAX_DEVICE_ID = 999_999_999  # --inject's DEVICE: nine digits, as many as any device id has

# What --inject can corrupt: one bit in one device's result of that test.
INJECT_KINDS = {
    "kat": "known-answer",
    "transfer": "transfer",
    "gemm": "gemm",
    "memory": "memory",
    "collective": "collective",
    "sustained": "sustained",
}
INJECT_LEVEL = {"kat": 1, "transfer": 1, "gemm": 2, "memory": 2, "collective": 2, "sustained": 3}


@dataclass(frozen=True)
class Injection:
    """Flip one bit of `device`'s output of the `kind` test (a collective: its ring-shift input from the left)."""

    kind: str
    device: int

    def text(self) -> str:
        return f"{self.kind}:{self.device}"


def parse_injection(text: str) -> Injection:
    """KIND:DEVICE, e.g. gemm:3; a usage error otherwise."""
    kind, separator, device_text = text.strip().partition(":")
    kind = kind.strip().lower()
    kinds = ", ".join(INJECT_KINDS)
    if not separator or kind not in INJECT_KINDS:
        raise UsageError(f"--inject {text!r}: use KIND:DEVICE with KIND one of {kinds} (e.g. gemm:3)")
    try:  # ASCII digits only: int() would take "１" (fullwidth) or "٣" as a device id
        device = parse_number(device_text.strip(), "DEVICE", minimum=0, maximum=MAX_DEVICE_ID, integer=True)
    except ValueError:
        raise UsageError(f"--inject {text!r}: DEVICE must be a device id (a whole number, e.g. gemm:3)") from None
    return Injection(kind, device)


@dataclass(frozen=True)
class DiagSettings:
    level: int = 1
    duration_s: float = DEFAULT_DURATION_S
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    inject: Injection | None = None
    seed: int = SEED
    rate_threshold: float = RATE_THRESHOLD
    # Problem sizes; the defaults fit the level's time budget on a small host.
    kat_size: int = 128
    transfer_bytes: int = 8 << 20
    gemm_size: int = 512
    sustained_size: int = 512
    collective_elements: int = 1 << 16
    memory_bytes: int | None = None  # one pattern buffer's size instead of the share of free memory

    def validate(self) -> None:
        if self.level not in LEVELS:
            raise UsageError(f"-r {self.level}: the level must be 1, 2 or 3")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise UsageError(f"--memory-fraction {self.memory_fraction:g}: use a share above 0 and at most 1")
        if not self.duration_s > 0:
            raise UsageError(f"--duration {self.duration_s:g}: use a positive duration")
        if self.inject is not None and INJECT_LEVEL[self.inject.kind] > self.level:
            raise UsageError(f"--inject {self.inject.text()}: that test runs from -r {INJECT_LEVEL[self.inject.kind]} "
                             f"on; this run is -r {self.level}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inject"] = self.inject.text() if self.inject else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagSettings:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        inject = values.pop("inject", None)
        return cls(**values, inject=parse_injection(inject) if inject else None)
