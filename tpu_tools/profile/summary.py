"""The profile summary: one document (`tpu-tools/profile/v1`) built from a trace and compile records.

`build_summary` works with whatever is known: a trace alone (`tpu-profile
summary` on a folder written by `jax.profiler`), compile records alone (the
trace window never opened), or both (`tpu-profile run`). The document is what
summary.json holds and what `--json` prints; the text report is rendered from
it, so a summary read back from disk renders exactly like a fresh one.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import msgspec

from tpu_tools import jsonout
from tpu_tools.errors import RuntimeFailure, first_line
from tpu_tools.infile import InputFileError, read_input_file
from tpu_tools.instrument.compiles import CompileLog
from tpu_tools.outside import OutsideError, convert, plain_json
from tpu_tools.profile.compiles import compile_rows, recompilations, user_functions
from tpu_tools.profile.trace import Dispatch, TraceData

SCHEMA = "tpu-tools/profile/v1"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.txt"
TOP_DEFAULT = 15
TOP_LEVEL_LABEL = "(top level of the program)"
NO_FRAMES_LABEL = "(unknown: the trace has no Python frames)"


def build_summary(*, source: str, trace: TraceData | None = None, compile_log: CompileLog | None = None,
                  program: dict | None = None, window: dict | None = None, trace_dir: Path | None = None,
                  top: int = TOP_DEFAULT, base_dir: str | None = None, notes: list[str] | None = None,
                  compile_source: str = "monitoring") -> dict:
    """The summary document; `source` is "run", "trace" or "capture"; `compile_source` says who recorded
    `compile_log`: "monitoring" (jax.monitoring) or "torch_xla" (its CompileTime samples)."""
    from tpu_tools.versions import stack_versions

    notes = list(notes or [])
    document: dict = {
        "schema": SCHEMA,
        "source": source,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "versions": stack_versions().to_dict(),
        "program": program,
        "window": window,
        "trace": None,
        "devices": [],
        "device_time_us": None,
        "top_ops": [],
        "modules": [],
        "host_dispatch": None,
        "compile_source": None,
        "compiles": [],
        "recompilations": [],
        "eager": None,
        "notes": notes,
    }
    if trace is not None:
        document["trace"] = _trace_section(trace, trace_dir)
        document.update(_device_sections(trace, top))
        document["host_dispatch"] = _host_dispatch(trace.dispatches)
        if trace.other_runs:
            notes.append(f"{len(trace.other_runs)} other trace run(s) in the folder were not read; "
                         f"this summary is of {trace.run_dir.name}")
        if not trace.has_python_frames and trace.dispatches:
            notes.append("the trace has no Python frames (python tracer off): call sites are unknown")
    calls = _call_counts(trace.dispatches) if trace is not None else None
    known_user = None
    if compile_log is not None:
        document["compile_source"] = compile_source
        document["compiles"] = [asdict(r) for r in compile_rows(compile_log, calls, base_dir)[:top]]
        document["recompilations"] = [asdict(r) for r in recompilations(compile_log, base_dir)]
        known_user = user_functions(compile_log)
    elif trace is not None:
        document["compile_source"] = "trace"
        document["compiles"], document["recompilations"] = _compiles_from_trace(trace)
        document["compiles"] = document["compiles"][:top]
        if document["compiles"]:
            notes.append("compile figures come from the trace alone (lowering and XLA compile inside calls); "
                         "run the program under `tpu-profile run` for JAX's compile events and recompile reasons")
    if trace is not None:
        document["eager"] = _eager_section(trace, known_user, top)
    return document


def _call_counts(dispatches: list[Dispatch]) -> dict[str, tuple[int, int]]:
    """Per function: (calls, calls that did not compile)."""
    calls: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    for d in dispatches:
        calls[d.name] += 1
        hits[d.name] += d.xla_compiles == 0
    return {name: (calls[name], hits[name]) for name in calls}


def _trace_section(trace: TraceData, trace_dir: Path | None) -> dict:
    perfetto = trace.run_dir / "perfetto_trace.json.gz"
    start = None
    if trace.start_time_ns is not None:
        start = datetime.datetime.fromtimestamp(trace.start_time_ns / 1e9, datetime.timezone.utc) \
            .isoformat(timespec="milliseconds")
    return {
        "dir": str(trace_dir if trace_dir is not None else trace.run_dir),
        "run_dir": str(trace.run_dir),
        "xplane_files": [str(f) for f in trace.files],
        "perfetto_file": str(perfetto) if perfetto.exists() else None,
        "start_time": start,
        "duration_us": round(trace.duration_ns / 1e3, 3),
        "hosts": trace.hosts,
        "python_frames": trace.has_python_frames,
        "jax_version": trace.metadata.get("jax_version"),
    }


def _busy_ns(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    busy, current_start, current_end = 0.0, 0.0, None
    for start, end in sorted(intervals):
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        if current_end is None or start > current_end:
            if current_end is not None:
                busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        busy += current_end - current_start
    return busy


def _device_sections(trace: TraceData, top: int) -> dict:
    ops = trace.ops
    lo = trace.window_start_ns
    hi = lo + trace.duration_ns
    per_device: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for op in ops:
        per_device[op.device].append((op.start_ns, op.start_ns + op.duration_ns))
    devices = []
    for device in trace.devices:
        intervals = per_device.get(device, [])
        busy = _busy_ns(intervals, lo, hi)
        devices.append({
            "device": device,
            "op_count": len(intervals),
            "busy_us": round(busy / 1e3, 3),
            "idle_us": round(max(hi - lo - busy, 0.0) / 1e3, 3),
            "busy_percent": round(100.0 * busy / (hi - lo), 2) if hi > lo else None,
        })
    total_ns = sum(o.self_ns for o in ops)
    grouped: dict[tuple[str | None, str], list[float]] = defaultdict(list)
    modules: dict[str | None, list[float]] = defaultdict(list)
    for op in ops:
        grouped[(op.module, op.name)].append(op.self_ns)
        modules[op.module].append(op.self_ns)
    top_ops = []
    for (module, name), times in sorted(grouped.items(), key=lambda item: -sum(item[1]))[:top]:
        total = sum(times)
        top_ops.append({
            "name": name,
            "module": module,
            "count": len(times),
            "total_us": round(total / 1e3, 3),
            "mean_us": round(total / len(times) / 1e3, 3),
            "percent_of_device_time": round(100.0 * total / total_ns, 2) if total_ns else None,
        })
    module_rows = []
    for module, times in sorted(modules.items(), key=lambda item: -sum(item[1]))[:top]:
        total = sum(times)
        module_rows.append({
            "name": module,
            "op_count": len(times),
            "total_us": round(total / 1e3, 3),
            "percent_of_device_time": round(100.0 * total / total_ns, 2) if total_ns else None,
        })
    return {"devices": devices, "device_time_us": round(total_ns / 1e3, 3), "top_ops": top_ops,
            "modules": module_rows}


def _host_dispatch(dispatches: list[Dispatch]) -> dict:
    """Host time of calls into jitted code; calls that compiled (tracing, lowering, XLA) are counted apart."""
    steady = [d for d in dispatches if not d.compile_ns]
    compiling = [d for d in dispatches if d.compile_ns]
    host_ns = sum(d.host_ns for d in steady)
    return {
        "dispatches": len(dispatches),
        "dispatch_time_us": round(host_ns / 1e3, 3),
        "mean_dispatch_us": round(host_ns / len(steady) / 1e3, 3) if steady else None,
        "compiling_dispatches": len(compiling),
        "compiling_dispatch_time_us": round(sum(d.duration_ns - d.device_ns for d in compiling) / 1e3, 3),
    }


def _compiles_from_trace(trace: TraceData) -> tuple[list[dict], list[dict]]:
    rows: dict[str, dict] = {}
    for d in trace.dispatches:
        row = rows.setdefault(d.name, {
            "function": d.name, "defined_at": None, "compiles": 0, "traces": None, "compile_time_s": 0.0,
            "trace_time_s": None, "lowering_time_s": None, "xla_compile_time_s": None,
            "persistent_cache_hits": None, "calls": 0, "cache_hits": 0})
        row["calls"] += 1
        row["compiles"] += d.xla_compiles
        row["compile_time_s"] += d.compile_ns / 1e9
        row["cache_hits"] += d.xla_compiles == 0
    if trace.orphan_compiles:
        rows["(outside any call)"] = {
            "function": "(outside any call)", "defined_at": None,
            "compiles": sum(c.xla_compile for c in trace.orphan_compiles), "traces": None,
            "compile_time_s": sum(c.duration_ns for c in trace.orphan_compiles) / 1e9, "trace_time_s": None,
            "lowering_time_s": None, "xla_compile_time_s": None, "persistent_cache_hits": None,
            "calls": None, "cache_hits": None}
    compiled = [r for r in rows.values() if r["compiles"]]
    for row in compiled:
        row["compile_time_s"] = round(row["compile_time_s"], 6)
    recompiled = [{"function": r["function"], "defined_at": None, "recompiles": r["compiles"] - 1,
                   "reasons": [{"reason": "not recorded in a trace: run the program under `tpu-profile run` "
                                          "for JAX's explanation", "count": r["compiles"] - 1, "call_sites": []}]}
                  for r in compiled if r["compiles"] > 1 and r["calls"] is not None]
    return (sorted(compiled, key=lambda r: (-r["compile_time_s"], r["function"])),
            sorted(recompiled, key=lambda r: (-r["recompiles"], r["function"])))


@functools.lru_cache(maxsize=1)
def library_op_names() -> frozenset[str]:
    """Names of JAX's own operations (numpy, lax, nn, random functions and primitives)."""
    import importlib

    names: set[str] = set()
    for module_name in ("jax.numpy", "jax.lax", "jax.nn", "jax.random", "jax.numpy.linalg", "jax.numpy.fft",
                        "jax.scipy.special", "jax.scipy.linalg"):
        try:
            names.update(n for n in dir(importlib.import_module(module_name)) if not n.startswith("__"))
        except ImportError:
            continue
    try:
        from jax._src.interpreters import mlir

        names.update(getattr(p, "name", "") for p in getattr(mlir, "_lowerings", {}))
    except ImportError:
        pass
    return frozenset(n for n in names if n)


def is_eager(dispatch: Dispatch, user: set[str] | None) -> bool:
    """An op-by-op dispatch: a JAX operation called outside jit, not one of the user's jitted functions."""
    if dispatch.traced_user_function:
        return False
    if dispatch.via_library:
        return True
    if user is not None:
        return dispatch.name not in user
    return dispatch.name.startswith("_") or dispatch.name in library_op_names()


def _eager_section(trace: TraceData, user: set[str] | None, top: int) -> dict:
    eager = [d for d in trace.dispatches if is_eager(d, user)]
    ops: dict[str, dict] = {}
    sites: dict[str, dict] = {}
    for d in eager:
        op = ops.setdefault(d.name, {"name": d.name, "count": 0, "host_time_us": 0.0})
        op["count"] += 1
        op["host_time_us"] += (d.duration_ns - d.compile_ns) / 1e3
        if d.caller is not None:
            label, function, file, line = d.caller.label, d.caller.function, d.caller.file, d.caller.line
        else:
            label = TOP_LEVEL_LABEL if trace.has_python_frames else NO_FRAMES_LABEL
            function, file, line = None, None, None
        site = sites.setdefault(label, {"call_site": label, "function": function, "file": file, "line": line,
                                        "dispatches": 0, "host_time_us": 0.0, "ops": {}})
        site["dispatches"] += 1
        site["host_time_us"] += (d.duration_ns - d.compile_ns) / 1e3
        site["ops"][d.name] = site["ops"].get(d.name, 0) + 1
    for entry in [*ops.values(), *sites.values()]:
        entry["host_time_us"] = round(entry["host_time_us"], 3)
    for site in sites.values():
        site["ops"] = dict(sorted(site["ops"].items(), key=lambda item: -item[1]))
    return {
        "dispatches": len(eager),
        "host_time_us": round(sum(d.duration_ns - d.compile_ns for d in eager) / 1e3, 3),
        "ops": sorted(ops.values(), key=lambda o: -o["count"])[:top],
        "call_sites": sorted(sites.values(), key=lambda s: -s["dispatches"])[:top],
    }


# --- files ---------------------------------------------------------------------------------------

def write_summary(document: dict, folder: Path) -> Path:
    from tpu_tools.atomic import write_file

    # Inside the output folder (which may be reused with --force): replaced whole, a planted link not followed.
    return write_file(folder / SUMMARY_FILE, jsonout.dumps(document) + "\n", force=True, what=SUMMARY_FILE)


MAX_SUMMARY_BYTES = 256 << 20

# What the report reads of a summary.json. Top-level sections may be missing or null (the report uses .get);
# inside them every field without a default must be present, and only those typed `| None` may be null: the
# report indexes them directly. Unknown fields are left alone.
class _Program(msgspec.Struct):
    argv: Annotated[list[str], msgspec.Meta(min_length=1)]
    module: str | None
    status: str
    exit_code: int | None
    error: str | None
    wall_time_s: float | None


class _Window(msgspec.Struct):
    mode: str | None
    delay_s: float
    duration_s: float | None
    opened_at_s: float | None
    closed_at_s: float | None
    first_step: int | None
    last_step: int | None
    closed_by: str | None
    note: str | None


class _Trace(msgspec.Struct):
    dir: str
    run_dir: str | None
    perfetto_file: str | None
    duration_us: float
    hosts: list[str]


class _Device(msgspec.Struct):
    device: str
    op_count: int
    busy_us: float
    idle_us: float | None
    busy_percent: float | None


class _Op(msgspec.Struct):
    name: str
    module: str | None
    count: int
    total_us: float
    mean_us: float
    percent_of_device_time: float | None


class _Module(msgspec.Struct):
    name: str
    op_count: int
    total_us: float
    percent_of_device_time: float | None


class _HostDispatch(msgspec.Struct):
    dispatches: int
    dispatch_time_us: float | None
    mean_dispatch_us: float | None
    compiling_dispatches: int
    compiling_dispatch_time_us: float | None


class _Compile(msgspec.Struct):
    function: str
    defined_at: str | None
    compiles: int | None
    traces: int | None
    persistent_cache_hits: int | None
    calls: int | None
    cache_hits: int | None
    compile_time_s: float | None
    trace_time_s: float | None
    lowering_time_s: float | None
    xla_compile_time_s: float | None


class _Reason(msgspec.Struct):
    reason: str
    count: int
    call_sites: list[str]


class _Recompilation(msgspec.Struct):
    function: str
    defined_at: str | None
    recompiles: int
    reasons: list[_Reason]


class _EagerOp(msgspec.Struct):
    name: str
    count: int
    host_time_us: float


class _CallSite(msgspec.Struct):
    call_site: str | None
    function: str | None
    file: str | None
    line: int | None
    dispatches: int
    host_time_us: float
    ops: dict[str, Any] | None = None


class _Eager(msgspec.Struct):
    dispatches: int
    host_time_us: float
    ops: list[_EagerOp]
    call_sites: list[_CallSite]


class _Summary(msgspec.Struct):
    program: _Program | None = None
    window: _Window | None = None
    trace: _Trace | None = None
    devices: list[_Device] | None = None
    device_time_us: float | None = None
    top_ops: list[_Op] | None = None
    modules: list[_Module] | None = None
    host_dispatch: _HostDispatch | None = None
    compile_source: str | None = None
    compiles: list[_Compile] | None = None
    recompilations: list[_Recompilation] | None = None
    eager: _Eager | None = None
    notes: list[str] | None = None


def load_summary(path: Path) -> dict | None:
    """The summary.json in a folder written by tpu-profile, or None when there is none.

    Read as an outside record: bounded in size, and every field the report uses checked for its type.
    """
    file = path / SUMMARY_FILE if path.is_dir() else None
    if file is None or not file.exists():
        return None
    remove = "; remove it to summarise the trace alone"
    try:
        data = read_input_file(file, "the summary", MAX_SUMMARY_BYTES)
    except InputFileError as error:
        raise RuntimeFailure(f"{error}{remove}") from None
    try:
        document = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise RuntimeFailure(f"{file} is not a readable summary (nested too deeply){remove}") from None
    except (OSError, ValueError) as error:
        raise RuntimeFailure(f"{file} is not a readable summary ({first_line(error, limit=200)}){remove}") \
            from error
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise RuntimeFailure(f"{file} is not a tpu-profile summary (schema {SCHEMA}){remove}")
    try:
        convert(plain_json(document), _Summary, root="summary")
    except OutsideError as error:
        raise RuntimeFailure(f"{file} is a damaged tpu-profile summary ({error}){remove}") from None
    # The document as written (its absent sections stay absent for the report's .get); every field it reads
    # has just been checked.
    return document


def relative_to_cwd(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path
