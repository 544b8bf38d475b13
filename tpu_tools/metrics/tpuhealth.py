"""ICI link health and TPU throttle scores, as libtpu's SDK formats them, checked into records.

libtpu's SDK describes both value formats (the agent reads them in the job, `tpu_tools.agent.tpusdk`):
- `ici_link_health`: one string per ICI link, `"tray1.chip3.ici0.int: 10"`: the link's location, then a score
  0 (healthy), 1-5 (a transient problem), 6-9 (a persistent minor problem), 10 (the link is not usable);
- `tpu_throttle_score`: one string per TPU device, `"1-1"`: the device id, then a score 0 (not throttled) to
  10 (throttled by 100 %), 10 % per step.
A value in no such form (a NaN, a negative or out-of-range score, text where a number belongs, a location
that names no tray/chip/ICI port, a repeated link or device, more links than any host has) is reported in
`problems`, never shown as health.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.records.jobs import ChipHealth
from tpu_tools.outside import OutsideError
from tpu_tools.shorten import quoted, shorten

LINK_HEALTH = "ici_link_health"
THROTTLE_SCORE = "tpu_throttle_score"
MAX_LINKS = 1024  # a host has a few chips of up to 6 ICI ports each: far fewer
MAX_DEVICES = 256
MAX_PROBLEMS = 20
MAX_SCORE = 10
_LOCATION = re.compile(r"tray(\d{1,6})\.chip(\d{1,6})\.ici(\d{1,6})\.([a-z][a-z0-9_]{0,15})", re.ASCII)
_LINK = re.compile(r"(\S{1,200}):\s*(\S{1,40})")
_THROTTLE = re.compile(r"(\d{1,6})-(\S{1,40})", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d{1,6}", re.ASCII)  # re.ASCII: \d is every script's digits otherwise


def link_state(score: int) -> str:
    """The SDK's words for a link score."""
    if score == 0:
        return "healthy"
    if score <= 5:
        return "transient problem"
    if score <= 9:
        return "persistent problem"
    return "unusable"


@dataclass(frozen=True)
class LinkHealth:
    location: str  # as libtpu names it, e.g. "tray1.chip3.ici0.int"
    tray: int
    chip: int
    port: int
    kind: str  # the last part of the location ("int" in the SDK's example)
    score: int  # 0 healthy .. 10 unusable

    @property
    def state(self) -> str:
        return link_state(self.score)

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "tray": self.tray, "chip": self.chip, "port": self.port,
                "kind": self.kind, "score": self.score, "state": self.state}


@dataclass(frozen=True)
class ThrottleScore:
    device: int
    score: int  # 0 .. 10

    @property
    def throttled_percent(self) -> int:
        return self.score * 10

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "score": self.score, "throttled_percent": self.throttled_percent}


@dataclass
class TpuHealth:
    links: list[LinkHealth] = field(default_factory=list)
    throttle: list[ThrottleScore] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one sentence per value that was not read

    @property
    def worst_link(self) -> LinkHealth | None:
        return max(self.links, key=lambda link: link.score, default=None)

    @property
    def worst_throttle(self) -> ThrottleScore | None:
        return max(self.throttle, key=lambda t: t.score, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"ici_links": [link.to_dict() for link in self.links],
                "throttle": [t.to_dict() for t in self.throttle], "problems": list(self.problems)}


def _score(text: str) -> int:
    """An integer score 0..10; OutsideError for anything else (a NaN, 1.5, -1, 11, text)."""
    if not _INTEGER.fullmatch(text):
        raise OutsideError(f"score {quoted(text, 60)} is not an integer 0..10")
    value = int(text)
    if not 0 <= value <= MAX_SCORE:
        raise OutsideError(f"score: {value} is out of range")
    return value


class _Problems:
    def __init__(self, problems: list[str]):
        self.problems = problems
        self.more = 0

    def add(self, sentence: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(sentence)
        else:
            self.more += 1

    def close(self) -> None:
        if self.more:
            self.problems.append(f"{self.more} more unreadable values")


def parse_link_health(values: Sequence[object], problems: list[str]) -> list[LinkHealth]:
    """The links of an `ici_link_health` read; each value not read is a sentence in `problems`."""
    report = _Problems(problems)
    if len(values) > MAX_LINKS:
        report.add(f"{LINK_HEALTH}: {len(values)} links, more than any host has; none read")
        report.close()
        return []
    links: dict[str, LinkHealth] = {}
    for value in values:
        match = _LINK.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None:
            report.add(f"{LINK_HEALTH}: {quoted(value, 60)} is not 'LOCATION: SCORE'")
            continue
        location, score_text = match.groups()
        where = _LOCATION.fullmatch(location)
        if where is None:
            report.add(f"{LINK_HEALTH}: unknown link name {quoted(location, 60)}")
            continue
        try:
            score = _score(score_text)
        except OutsideError as error:
            report.add(f"{LINK_HEALTH} {location}: {error}")
            continue
        if location in links:
            report.add(f"{LINK_HEALTH}: link {location} repeated (the first was kept)")
            continue
        tray, chip, port, kind = where.groups()
        links[location] = LinkHealth(location, int(tray), int(chip), int(port), kind, score)
    report.close()
    return sorted(links.values(), key=lambda link: (link.tray, link.chip, link.port, link.kind))


def parse_throttle(values: Sequence[object], problems: list[str]) -> list[ThrottleScore]:
    """The devices of a `tpu_throttle_score` read; each value not read is a sentence in `problems`."""
    report = _Problems(problems)
    if len(values) > MAX_DEVICES:
        report.add(f"{THROTTLE_SCORE}: {len(values)} devices, more than any host has; none read")
        report.close()
        return []
    scores: dict[int, ThrottleScore] = {}
    for value in values:
        match = _THROTTLE.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None:
            report.add(f"{THROTTLE_SCORE}: {quoted(value, 60)} is not 'DEVICE-SCORE'")
            continue
        device = int(match.group(1))
        try:
            score = _score(match.group(2))
        except OutsideError as error:
            report.add(f"{THROTTLE_SCORE} device {device}: {error}")
            continue
        if device in scores:
            report.add(f"{THROTTLE_SCORE}: device {device} repeated (the first was kept)")
            continue
        scores[device] = ThrottleScore(device, score)
    report.close()
    return sorted(scores.values(), key=lambda t: t.device)


def health_from_sdk(metrics: object) -> TpuHealth | None:
    """From the agent's `tpu_sdk.metrics` ({name: {"values": [...]} or {"error": ...}}); None when neither
    health metric was read."""
    if not isinstance(metrics, dict):
        return None
    health = TpuHealth()
    links = _values(metrics, LINK_HEALTH, health.problems)
    throttle = _values(metrics, THROTTLE_SCORE, health.problems)
    if links is not None:
        health.links = parse_link_health(links, health.problems)
    if throttle is not None:
        health.throttle = parse_throttle(throttle, health.problems)
    return health if links is not None or throttle is not None or health.problems else None


def _values(metrics: dict[Any, Any], name: str, problems: list[str]) -> list[object] | None:
    entry = metrics.get(name)
    if not isinstance(entry, dict):
        return None
    if entry.get("error") is not None:
        problems.append(f"{name}: {shorten(str(entry['error']), 200)}")
        return None
    values = entry.get("values")
    if not isinstance(values, list):
        problems.append(f"{name}: no list of values")
        return None
    dropped = entry.get("dropped")
    if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped > 0:
        problems.append(f"{name}: {dropped} more values than the agent reads were left out")
    return values


def attention(health: ChipHealth | None) -> list[str]:
    """Sentences for what needs a look, from a health record: links that are not healthy (worst first), throttled
    devices, values that were not read."""
    if health is None:
        return []
    lines = []
    for link in sorted(health.ici_links, key=lambda link: -(link.score or 0)):
        if link.score:
            lines.append(f"ICI link {link.location} is at {link.score} of 10 ({link_state(link.score)})")
    for device in health.throttle:
        if device.score > 0:
            lines.append(f"TPU device {device.device} is throttled by {device.throttled_percent} %")
    lines += [f"health value not read: {problem}" for problem in health.problems]
    return lines


def short_health(health: ChipHealth | None) -> tuple[str, str]:
    """(text of at most 7 characters, level) for a table cell: the worst link, else the worst throttling.

    level: "error" (a link unusable), "warn" (a link with a problem, a throttled device, a value not read),
    "ok", or "none" (no health read)."""
    if health is None:
        return "-", "none"
    link = max((x.score or 0 for x in health.ici_links), default=None)
    throttle = max((x.score for x in health.throttle), default=None)
    if link is not None and link >= 10:
        return "ICI 10", "error"
    if link is not None and link > 0:
        return f"ICI {link}", "warn"
    if throttle:
        return f"thr{throttle * 10}%", "warn"
    if health.problems:
        return "?", "warn"
    return ("ok", "ok") if link is not None or throttle is not None else ("-", "none")
