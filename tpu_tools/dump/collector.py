"""What a collector is, what it is given, and how it hands files to the bundle.

A collector is a named function `collect(ctx)` that reads one part of the
machine and adds files through its `CollectContext`. Each runs in its own
child process with its own time limit (see `runner`), so it may block, raise
or crash without taking the dump with it. Everything it adds is redacted on
the way in (`ctx.add_*`), inside that child, before it leaves the process.

Collectors signal outcomes other than "ok" by raising:
- `Skipped(reason)`: nothing to collect here (no cache configured, TPU held);
- `TimedOut(message)`: a bounded wait inside the collector ran out;
- anything else: the collector failed, with that error.
Files added before the exception are kept.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tpu_tools import jsonout
from tpu_tools.dump.redact import Redactor
from tpu_tools.metrics.libtpu.addresses import DEFAULT_TIMEOUT_S as METRICS_TIMEOUT_S
from tpu_tools.metrics.libtpu.addresses import default_address
from tpu_tools.pjrt.runtime import RuntimePolicy

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_TIMED_OUT = "timed_out"
STATUS_SKIPPED = "skipped"

TRIM_TAIL = "tail"  # logs: keep the newest lines
TRIM_HEAD = "head"  # dumps: keep the beginning


class Skipped(Exception):
    """Nothing to collect; the message says why."""


class TimedOut(Exception):
    """A bounded wait inside the collector ran out; the message says what hung."""


@dataclass(frozen=True)
class Collector:
    name: str  # "<category>.<what>", e.g. "system.cpu"; --only/--skip take a name or a category
    summary: str  # one line for --list-collectors and the man page
    collect: Callable[[CollectContext], None]
    starts_first: bool = False  # the slow ones (a runtime start) are started before the rest

    @property
    def category(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class DumpOptions:
    """What the user asked for that collectors need to know."""

    root: Path
    policy: RuntimePolicy
    timeout_s: float
    add_paths: tuple[str, ...] = ()
    force_runtime: bool = False
    metrics_addresses: tuple[str, ...] = field(default_factory=lambda: (default_address(),))  # libtpu's services
    metrics_timeout_s: float = METRICS_TIMEOUT_S  # the longest deadline of a call to them


@dataclass
class CollectedFile:
    """One file for the bundle, already redacted."""

    name: str  # path inside the bundle, relative to its top folder
    data: bytes
    collector: str
    redactions: dict[str, int] = field(default_factory=dict)
    trim: str | None = None  # how --max-size may shorten it: TRIM_TAIL, TRIM_HEAD or None (never)
    source: str | None = None  # the file it was read from, when it is a copy
    source_size_bytes: int | None = None  # that file's size when only part of it was taken


def check_member_name(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name in ("manifest.json",) or "\\" in name:
        raise ValueError(f"bad bundle file name {name!r}")
    return str(path)


class CollectContext:
    """Handed to `Collector.collect`: the options, the time left, and where files go."""

    def __init__(self, collector: str, options: DumpOptions, redactor: Redactor,
                 emit: Callable[[CollectedFile], None], emit_note: Callable[[str], None]):
        self.collector = collector
        self.options = options
        self.redactor = redactor
        self._emit = emit
        self._emit_note = emit_note
        self.started = time.monotonic()

    @property
    def root(self) -> Path:
        return self.options.root

    @property
    def policy(self) -> RuntimePolicy:
        return self.options.policy

    def remaining_s(self) -> float:
        return self.options.timeout_s - (time.monotonic() - self.started)

    def add_bytes(self, name: str, data: bytes, *, trim: str | None = None, source: str | None = None,
                  source_size_bytes: int | None = None, redacted: Counter | None = None) -> None:
        """Add a file; `redacted` counts replacements the collector already made in `data` (env values)."""
        counts: Counter = Counter(redacted or {})
        name = check_member_name(self.redactor.text(name))
        data = self.redactor.data(data, counts)
        self._emit(CollectedFile(name, data, self.collector, dict(counts), trim,
                                 self.redactor.text(source) if source else None, source_size_bytes))

    def add_text(self, name: str, text: str, **kwargs: Any) -> None:
        self.add_bytes(name, text.encode("utf-8", "surrogateescape"), **kwargs)

    def add_json(self, name: str, document: Any, **kwargs: Any) -> None:
        self.add_text(name, jsonout.dumps(document) + "\n", **kwargs)

    def note(self, text: str) -> None:
        """Something the reader should know (an unreadable source, a cap that applied)."""
        self._emit_note(self.redactor.text(text))


def select(collectors: list[Collector], only: tuple[str, ...], skip: tuple[str, ...]) -> dict[str, str]:
    """Name -> why a collector does not run ("" when it runs). Raises ValueError naming unknown entries."""
    names = {c.name for c in collectors}
    categories = {c.category for c in collectors}

    def expand(values: tuple[str, ...], option: str) -> set[str]:
        wanted = {v.strip() for value in values for v in value.split(",") if v.strip()}
        unknown = sorted(wanted - names - categories)
        if unknown:
            raise ValueError(f"{option}: unknown collector {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(sorted(categories))} or one of {', '.join(sorted(names))}")
        return wanted

    chosen = expand(only, "--only")
    dropped = expand(skip, "--skip")
    reasons = {}
    for collector in collectors:
        if chosen and collector.name not in chosen and collector.category not in chosen:
            reasons[collector.name] = "not selected (--only)"
        elif collector.name in dropped or collector.category in dropped:
            reasons[collector.name] = "not selected (--skip)"
        else:
            reasons[collector.name] = ""
    return reasons
