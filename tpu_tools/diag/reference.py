"""GEMM digests compared with a reference that is not the device under test: a file saved on a trusted
machine (`--save-reference`, `--reference`), or the fleet (tpu-monitor exports each host's digests).

A digest means something only beside another of the same program, inputs and runtime: the key is the
platform, the device kind, the jax and jaxlib versions, the runtime's version, the XLA flags that change
code (the CPU platform's device count does not), the test (dtype), the shape and the seed. A reference
under another key is "not comparable": a warning, never a pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from tpu_tools import jsonout
from tpu_tools.diag.records import FAIL, PASS, WARN, Check, DiagReport
from tpu_tools.errors import UsageError
from tpu_tools.infile import InputFileError, read_input_file

SCHEMA = "tpu-tools/diag-reference/v1"
MAX_BYTES = 1 << 20
_NEUTRAL_FLAGS = ("--xla_force_host_platform_device_count",)  # how many devices, not how they compute


def xla_flags(text: str | None) -> str:
    """The XLA flags that can change a program's bits, sorted (their order does not matter)."""
    try:
        flags = shlex.split(text or "")
    except ValueError:
        flags = (text or "").split()
    return " ".join(sorted(f for f in flags if not f.startswith(_NEUTRAL_FLAGS)))


def runtime_key(jax: Any, device: Any) -> dict[str, Any]:
    """The run-wide part of a digest's key (needs jax imported)."""
    try:
        import jaxlib

        jaxlib_version = str(getattr(jaxlib, "__version__", None) or jaxlib.version.__version__)
    except (ImportError, AttributeError):
        jaxlib_version = None
    try:
        runtime = str(device.client.platform_version)
    except Exception:  # noqa: BLE001 a plugin without the attribute: the jaxlib version stands for it
        runtime = None
    return {"platform": device.platform, "device_kind": device.device_kind, "jax": jax.__version__,
            "jaxlib": jaxlib_version, "runtime": runtime, "xla_flags": xla_flags(os.environ.get("XLA_FLAGS"))}


def digest_key(runtime: dict[str, Any], test: str, shape: list[int], dtype: str, seed: int) -> dict[str, Any]:
    return {**runtime, "test": test, "shape": list(shape), "dtype": dtype, "seed": seed}


def key_id(key: dict[str, Any]) -> str:
    """A short name of a key, the same on every host (the fleet's label)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Entry:
    key: dict[str, Any]
    digest: str
    host: str = ""
    time: str = ""


@dataclass
class Reference:
    path: str
    entries: list[Entry] = field(default_factory=list)

    def find(self, key: dict[str, Any]) -> Entry | None:
        wanted = key_id(key)
        return next((e for e in self.entries if key_id(e.key) == wanted), None)

    def nearest(self, test: str) -> Entry | None:
        return next((e for e in self.entries if e.key.get("test") == test), None)


def reference_entries(report: DiagReport) -> list[Entry]:
    """The run's judged-good GEMM digests: the one every device of a test agreed on (none where one failed)."""
    entries: list[Entry] = []
    for test in dict.fromkeys(c.test for c in report.checks if "key" in c.figures):
        checks = [c for c in report.checks if c.test == test]
        digests = {c.figures.get("digest") for c in checks}
        if any(c.status in (FAIL, WARN) for c in checks) or len(digests) != 1:
            continue
        entries.append(Entry(dict(checks[0].figures["key_fields"]), str(digests.pop()), report.host, report.time))
    return entries


def save_reference(report: DiagReport, path: str) -> int:
    """Write the run's reference digests to `path`; returns how many. Raises UsageError."""
    from tpu_tools.atomic import write_file

    entries = reference_entries(report)
    document = {"schema": SCHEMA, "entries": [vars(e) for e in entries]}
    write_file(path, jsonout.dumps(document) + "\n", True, what="--save-reference", option="--save-reference")
    return len(entries)


def load_reference(path: str) -> Reference:
    """Read a reference file before the run; a UsageError names what is wrong with it."""
    try:
        document = json.loads(read_input_file(path, "--reference", MAX_BYTES).decode("utf-8"))
    except InputFileError as error:
        raise UsageError(str(error)) from None
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"--reference {path}: not a JSON document") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise UsageError(f"--reference {path}: not a tpu-diag reference (schema {SCHEMA}; write one with "
                         "--save-reference)")
    reference = Reference(path)
    for entry in document.get("entries") or []:
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), dict)
                and isinstance(entry.get("digest"), str)):
            raise UsageError(f"--reference {path}: an entry without a key and a digest")
        reference.entries.append(Entry(entry["key"], entry["digest"], str(entry.get("host") or ""),
                                       str(entry.get("time") or "")))
    return reference


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    names = [name for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
    return ", ".join(f"{name} {theirs.get(name)!r} there, {mine.get(name)!r} here" for name in names[:3])


def compare_with_reference(report: DiagReport, reference: Reference) -> list[Check]:
    """One check per device and GEMM test: its digest against the reference's under the same key."""
    found: list[Check] = []
    for check in [c for c in report.checks if "key_fields" in c.figures and c.device is not None]:
        key = check.figures["key_fields"]
        test = f"{check.test} reference"
        digest = check.figures.get("digest")
        entry = reference.find(key)
        if entry is None:
            near = reference.nearest(check.test)
            why = (f"not comparable: {_differences(key, near.key)}" if near else
                   f"not comparable: {reference.path} has no {check.test} digest")
            found.append(Check(test, WARN, why, device=check.device, process_id=check.process_id))
        elif entry.digest == digest:
            found.append(Check(test, PASS, f"digest {digest} matches the reference (saved on {entry.host or '?'})",
                               device=check.device, process_id=check.process_id))
        else:
            found.append(Check(test, FAIL, f"digest {digest} differs from the reference {entry.digest} (saved on "
                                           f"{entry.host or '?'} {entry.time})", device=check.device,
                               process_id=check.process_id))
    return found
