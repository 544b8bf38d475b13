"""`tpu-dump` from start to end: choose collectors, run them, write the bundle."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from tpu_tools import jsonout
from tpu_tools.dump.bundle import (
    DEFAULT_MAX_SIZE_BYTES,
    default_name,
    prepare_output,
    top_folder,
    write_within,
)
from tpu_tools.dump.collector import (
    METRICS_TIMEOUT_S,
    STATUS_FAILED,
    CollectedFile,
    Collector,
    DumpOptions,
    select,
)
from tpu_tools.dump.manifest import Manifest, StoredFile, build_manifest, skipped_result
from tpu_tools.dump.redact import make_redactor
from tpu_tools.dump.runner import CollectorResult, Progress, run_collectors
from tpu_tools.errors import UsageError
from tpu_tools.metrics.libtpu.addresses import default_address
from tpu_tools.pjrt.discover import sysroot
from tpu_tools.pjrt.runtime import RuntimePolicy

DEFAULT_TIMEOUT_S = 20.0


@dataclass
class DumpRequest:
    output: Path | None = None  # None: tpu-dump-<host>-<utc time>.tar.gz in the current folder
    force: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES
    add_paths: tuple[str, ...] = ()
    redact: bool = True
    policy: RuntimePolicy = field(default_factory=RuntimePolicy)
    force_runtime: bool = False
    command: list[str] = field(default_factory=list)
    metrics_addresses: tuple[str, ...] = field(default_factory=lambda: (default_address(),))
    metrics_timeout_s: float = METRICS_TIMEOUT_S


@dataclass
class DumpReport:
    path: Path
    size_bytes: int
    manifest: Manifest
    over_max_size: bool

    def report(self) -> DumpDocument:
        """`tpu-dump --json`: the manifest and where the bundle is."""
        return DumpDocument(**msgspec.structs.asdict(self.manifest),
                            bundle=BundleFile(path=str(self.path), size_bytes=self.size_bytes))


class BundleFile(msgspec.Struct, kw_only=True):
    path: str
    size_bytes: int


class DumpDocument(Manifest, kw_only=True):
    """`tpu-dump --json`: the manifest's fields, then the bundle written."""

    bundle: BundleFile


def _check_add_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    checked = []
    for path in paths:
        if not os.path.lexists(path):
            raise UsageError(f"--add {path}: no such file or folder")
        if not os.path.exists(path):
            raise UsageError(f"--add {path}: a symbolic link to {os.path.realpath(path)}, which does not exist")
        checked.append(os.path.abspath(path))
    return tuple(checked)


def _error_files(results: list[CollectorResult]) -> None:
    """A failed collector's traceback goes into the bundle, for whoever fixes the collector."""
    for result in results:
        if result.status == STATUS_FAILED and result.traceback:
            result.files.append(CollectedFile(f"errors/{result.name}.txt", result.traceback.encode(), result.name))


def _unique(stored: list[StoredFile]) -> list[StoredFile]:
    seen: set[str] = set()
    for item in stored:
        name, number = item.file.name, 2
        while item.file.name in seen:
            item.file.name = f"{name}~{number}"
            number += 1
        seen.add(item.file.name)
    return stored


def create_bundle(request: DumpRequest, collectors: list[Collector] | None = None,
                  on_progress: Callable[[Progress], None] | None = None) -> DumpReport:
    """Collect and write one bundle; raises UsageError for bad input, KeyboardInterrupt leaves no file."""
    if collectors is None:
        from tpu_tools.dump.collectors import COLLECTORS

        collectors = COLLECTORS
    try:
        reasons = select(collectors, request.only, request.skip)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if request.max_size_bytes < 1:
        raise UsageError("--max-size must be positive")
    add_paths = _check_add_paths(request.add_paths)
    started = time.monotonic()
    now = datetime.now(timezone.utc)
    host = socket.gethostname()
    output = request.output or Path.cwd() / default_name(host, now.strftime("%Y%m%dT%H%M%SZ"))
    pending = prepare_output(output, request.force)
    try:
        redactor = make_redactor(request.redact)
        options = DumpOptions(root=sysroot(), policy=request.policy, timeout_s=request.timeout_s,
                              add_paths=add_paths, force_runtime=request.force_runtime,
                              metrics_addresses=tuple(request.metrics_addresses),
                              metrics_timeout_s=request.metrics_timeout_s)
        ran = run_collectors([c for c in collectors if not reasons[c.name]], options, redactor, on_progress)
        by_name = {r.name: r for r in ran}
        results = [by_name.get(c.name) or skipped_result(c.name, reasons[c.name]) for c in collectors]
        _error_files(results)
        stored = _unique([StoredFile(f, f.data) for r in results for f in r.files])
        command = [redactor.text(word) for word in request.command]
        option_record = {
            "only": list(request.only), "skip": list(request.skip), "timeout_s": request.timeout_s,
            "max_size_bytes": request.max_size_bytes, "redact": request.redact,
            "add": [redactor.text(path) for path in add_paths],
            "platform": request.policy.platform, "force_runtime": request.force_runtime,
            "metrics_addresses": list(request.metrics_addresses), "metrics_timeout_s": request.metrics_timeout_s,
        }

        def make_manifest(current: list[StoredFile], notes: list[str]) -> Manifest:
            return build_manifest(host=host, time=now.isoformat(timespec="seconds").replace("+00:00", "Z"),
                                  duration_s=time.monotonic() - started, command=command, options=option_record,
                                  results=results, stored=current, redaction_enabled=request.redact,
                                  notes=[*([] if request.redact else ["redaction was turned off (--no-redact)"]),
                                         *notes])

        def encode(manifest: Manifest) -> bytes:
            return (jsonout.dumps(manifest) + "\n").encode()

        top = top_folder(pending.final)
        fit = write_within(pending, top, stored, request.max_size_bytes, now.timestamp(), make_manifest, encode)
        path = pending.commit()
    except BaseException:
        pending.discard()
        raise
    return DumpReport(path, fit.size_bytes, fit.manifest, fit.over_limit)
