"""libtpu's stall and crash files: `tpu_stall_summary_*.pb`, `tpu_core_dump_*.bin`, `tpu_compiler_metadata_*.pb`.

Where libtpu writes them (from its flags and messages, as libtpu 0.0.51 names them): diagnostic artifacts to
`--xla_tpu_impure_diagnostic_artifacts_dir` ("Writing large ASIC core dumps to /tmp; ... override
--xla_tpu_impure_diagnostic_artifacts_dir"), core dumps to `--tpu_core_dump_directory` or
`TPU_CORE_DUMP_DIRECTORY`, logs to `TPU_LOG_DIR` (default /tmp/tpu_logs); flags come in `LIBTPU_INIT_ARGS`.
The folders searched are the ones this process's environment and the TPU holders' name, plus /tmp and
/tmp/tpu_logs, each without descending. Bounded: the newest MAX_PER_KIND files of each kind, up to
MAX_FILE_BYTES each and MAX_TOTAL_BYTES in all; a larger file is listed, not copied.

Where libtpu is installed (found without importing it), each file is decoded by `libtpu.sdk.diagnostics` in
a child of its own under the bundle's deadline (and DECODE_TIMEOUT_S): a decoder that crashes or hangs costs
only that file's decode. The decoded form lands next to the copies (`libtpu/diagnostics/decoded/`);
`tpu-dump show` names the stalled cores, their program and HLO location from it.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tpu_tools.dump.collector import CollectContext, Skipped
from tpu_tools.dump.sysfiles import describe_os_error, under_root
from tpu_tools.dump.tree import read_capped
from tpu_tools.pjrt.discover import discover

KINDS = {"stall_summary": "tpu_stall_summary_*.pb", "core_dump": "tpu_core_dump_*.bin",
         "compiler_metadata": "tpu_compiler_metadata_*.pb"}
READERS = {"stall_summary": "read_stall_summaries", "core_dump": "read_core_dump",
           "compiler_metadata": "read_compiler_metadata"}
DEFAULT_FOLDERS = ("/tmp", "/tmp/tpu_logs")
FLAGS = ("--xla_tpu_impure_diagnostic_artifacts_dir", "--tpu_core_dump_directory")
VARIABLES = ("TPU_CORE_DUMP_DIRECTORY", "TPU_LOG_DIR")
MAX_PER_KIND = 8
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 64 << 20
MAX_DECODED_BYTES = 1 << 20
DECODE_TIMEOUT_S = 20.0
INDEX = "libtpu/diagnostics/index.json"

# Runs in the child: one file, one decoder, JSON on stdout. A crash (SIGABRT) or hang is the parent's to see.
_DECODE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a decoder that aborts writes no core file
from libtpu.sdk import diagnostics
result = getattr(diagnostics, sys.argv[1])(sys.argv[2])
sys.stdout.write(json.dumps(result, default=repr))
"""


def folders_from(environ: dict[str, str]) -> list[str]:
    """The folders an environment names for libtpu's diagnostic files (flags in LIBTPU_INIT_ARGS, variables)."""
    found = [environ[name] for name in VARIABLES if environ.get(name)]
    try:
        words = shlex.split(environ.get("LIBTPU_INIT_ARGS", ""))
    except ValueError:
        words = []
    for word in words:
        flag, _, value = word.partition("=")
        if flag in FLAGS and value:
            found.append(value)
    return found


def _holder_environments(ctx: CollectContext) -> list[dict[str, str]]:
    environments = []
    for pid in sorted({h.pid for chip in discover(ctx.root).chips for h in chip.holders} - {os.getpid()}):
        try:
            with open(under_root(f"/proc/{pid}/environ", ctx.root), "rb") as handle:
                raw = handle.read(1 << 20)
        except OSError:
            continue
        pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
        environments.append({name: value for name, _, value in pairs})
    return environments


def find_files(folders: list[str], root: Path | None) -> dict[str, list[tuple[str, Path, os.stat_result]]]:
    """kind -> [(host path, path to read, stat)], newest first, from each folder (not descending)."""
    found: dict[str, list[tuple[str, Path, os.stat_result]]] = {kind: [] for kind in KINDS}
    seen: set[str] = set()
    for folder in dict.fromkeys(os.path.normpath(f) for f in folders if os.path.isabs(f)):
        real = under_root(folder, root)
        try:
            names = sorted(os.listdir(real))[:100_000]
        except OSError:
            continue
        for name in names:
            kind = next((k for k, pattern in KINDS.items() if fnmatch.fnmatchcase(name, pattern)), None)
            host = os.path.join(folder, name)
            if kind is None or host in seen:
                continue
            try:
                status = os.lstat(real / name)
            except OSError:
                continue
            if stat.S_ISREG(status.st_mode):
                seen.add(host)
                found[kind].append((host, real / name, status))
    for items in found.values():
        items.sort(key=lambda item: item[2].st_mtime, reverse=True)
    return found


def decoder_available() -> bool:
    """Whether libtpu (with its SDK) is installed where this Python finds it; nothing is imported."""
    try:
        spec = importlib.util.find_spec("libtpu")
    except (ImportError, ValueError):
        return False
    locations = list(spec.submodule_search_locations or []) if spec else []
    return any((Path(location) / "sdk.so").exists() or (Path(location) / "sdk").is_dir() for location in locations)


def decode(kind: str, path: Path, timeout_s: float) -> dict[str, Any]:
    """{"decoded": dict} or {"error": why}: libtpu's decoder of this kind, in a child, within timeout_s."""
    if timeout_s <= 0:
        return {"error": "no time left before the bundle's deadline"}
    with tempfile.TemporaryDirectory(prefix="tpu-dump-libtpu-") as logs:
        # libtpu writes its own logs on load: into a scratch folder, not the host's /tmp/tpu_logs being collected
        env = {**os.environ, "TPU_SKIP_MDS_QUERY": "1", "TPU_LOG_DIR": logs}
        try:
            child = subprocess.run([sys.executable, "-c", _DECODE, READERS[kind], str(path)], capture_output=True,
                                   env=env, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"error": f"the decoder did not finish in {timeout_s:.0f} s"}
        except OSError as error:
            return {"error": f"the decoder could not start: {describe_os_error(error)}"}
    if child.returncode != 0:
        how = f"signal {-child.returncode}" if child.returncode < 0 else f"exit {child.returncode}"
        last = [line for line in child.stderr.decode("utf-8", "replace").splitlines() if line.strip()][-1:]
        return {"error": f"the decoder failed ({how})" + (f": {last[0][:300]}" if last else "")}
    if len(child.stdout) > MAX_DECODED_BYTES:
        return {"error": f"the decoded form is larger than {MAX_DECODED_BYTES >> 20} MiB; left out"}
    try:
        document = json.loads(child.stdout)
    except ValueError:
        return {"error": "the decoder wrote no JSON"}
    return {"decoded": document} if isinstance(document, dict) else {"error": "the decoder returned no mapping"}


def collect_libtpu_diagnostics(ctx: CollectContext) -> None:
    folders = [*folders_from(dict(os.environ))]
    for environment in _holder_environments(ctx):
        folders += folders_from(environment)
    folders += DEFAULT_FOLDERS
    found = find_files(folders, ctx.root)
    if not any(found.values()):
        raise Skipped(f"no libtpu stall or crash files in {', '.join(dict.fromkeys(folders))}")
    decoding = decoder_available()
    budget = MAX_TOTAL_BYTES
    index: dict[str, Any] = {"folders": list(dict.fromkeys(folders)), "decoder": "libtpu.sdk.diagnostics"
                             if decoding else None, "files": []}
    for kind, items in found.items():
        for position, (host, real, status) in enumerate(items):
            entry: dict[str, Any] = {"kind": kind, "path": host, "size_bytes": status.st_size,
                                     "mtime_unix_s": status.st_mtime, "copied": None, "decoded": None, "error": None}
            index["files"].append(entry)
            if position >= MAX_PER_KIND:
                entry["error"] = f"not copied: only the newest {MAX_PER_KIND} of this kind are"
                continue
            if status.st_size > min(MAX_FILE_BYTES, budget):
                entry["error"] = "not copied: larger than the room left (MiB): " \
                                 f"{min(MAX_FILE_BYTES, budget) >> 20}"
            else:
                try:
                    data, _ = read_capped(str(real), MAX_FILE_BYTES, keep="head")
                except OSError as error:
                    entry["error"] = describe_os_error(error)
                    continue
                budget -= len(data)
                entry["copied"] = f"libtpu/diagnostics/{os.path.basename(host)}"
                ctx.add_bytes(entry["copied"], data, source=host, redacted=Counter())
            if decoding:
                result = decode(kind, real, min(DECODE_TIMEOUT_S, ctx.remaining_s() - 2.0))  # room to write the index
                entry["error"] = entry["error"] or result.get("error")
                if "decoded" in result:
                    entry["decoded"] = f"libtpu/diagnostics/decoded/{os.path.basename(host)}.json"
                    ctx.add_json(entry["decoded"], {"kind": kind, "path": host, "decoded": result["decoded"]})
    ctx.add_json(INDEX, index)
    if not decoding:
        ctx.note("libtpu is not installed for this Python: the stall and crash files are copied, not decoded")


def _text(value: object, limit: int = 200) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(value)[:limit])


def stall_cores(decoded: object, limit: int = 8) -> list[str]:
    """One phrase per core of a decoded stall summary: core, chip, program, run, HLO location, error.
    The decoded form comes from a bundle (outside data): anything not of the expected shape is left out."""
    states = decoded.get("core_states") if isinstance(decoded, dict) else None
    if not isinstance(states, dict):
        return []
    phrases = []
    for key in sorted(states, key=lambda k: (len(str(k)), str(k)))[:limit]:
        core: dict[str, Any] = states[key] if isinstance(states[key], dict) else {}
        core_id: dict[str, Any] = core["core_id"] if isinstance(core.get("core_id"), dict) else {}
        sequencers = [s for s in core.get("sequencer_info") or [] if isinstance(s, dict)] \
            if isinstance(core.get("sequencer_info"), list) else []
        current = next((s for s in sequencers if s.get("program_id") or s.get("run_id")), sequencers[0]
                       if sequencers else {})
        parts = [f"core {_text(key, 12)}"]
        if core_id.get("chip_id") is not None:
            parts[0] += f" (chip {_text(core_id['chip_id'], 12)})"
        if current.get("program_id") is not None:
            parts.append(f"program {_text(current['program_id'], 24)}")
        if current.get("run_id") is not None:
            parts.append(f"run {_text(current['run_id'], 24)}")
        if current.get("hlo_location"):
            parts.append(f"at {_text(current['hlo_location'])}")
        if core.get("error_message"):
            parts.append(f"error: {_text(core['error_message'])}")
        phrases.append(" ".join(parts))
    if len(states) > limit:
        phrases.append(f"{len(states) - limit} more cores")
    return phrases
