"""Reading the traces JAX's profiler writes: XSpace protobufs (`*.xplane.pb`).

The files are parsed by jaxlib itself (`jax.profiler.ProfileData`), not by
hand. From them this module extracts what the summary needs:

- device ops: events on a device plane ("/device:TPU:0" and its "XLA Ops"
  line, or GPU stream lines), or events that carry an `hlo_op` stat on the
  host plane (the CPU platform runs its ops on host threads);
- dispatches: the host-side calls into jitted code, traced by jaxlib as
  "PjitFunction(<name>)"; only outermost ones that ran a program count
  (inner ones, and calls made while another function is traced, run
  nothing), with the device time and compile time spent inside them and
  the Python frames around them (when the Python tracer was on);
- the trace window (the session's start and stop times).

Layout on disk (what `jax.profiler.trace(log_dir)` writes):
    log_dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.xplane.pb
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.errors import RuntimeFailure, UsageError, first_line
from tpu_tools.parsing import ascii_digits
from tpu_tools.profile.frames import Frame, FrameClassifier, parse_frame

XPLANE_SUFFIX = ".xplane.pb"
DISPATCH_PREFIXES = ("PjitFunction(", "PmapFunction(")
# jax's own trace annotations around lowering and XLA compilation.
COMPILE_EVENT_NAMES = frozenset({"lower_sharding_computation", "backend_compile_and_load"})
XLA_COMPILE_EVENT = "backend_compile_and_load"
# Lines of a device plane that describe programs or steps rather than ops.
_DEVICE_META_LINES = ("XLA Modules", "Steps", "XLA TraceMe", "Framework Name Scope", "Framework Ops",
                      "Source code", "Launch Stats", "Async XLA Ops", "SparseCore")
_MAX_SEARCH_DEPTH = 6


@dataclass
class DeviceOp:
    device: str  # "TPU:0", "GPU:1", "cpu:0"
    module: str | None  # the XLA program (HLO module) it belongs to
    name: str  # HLO op name
    start_ns: float
    duration_ns: float
    self_ns: float  # duration less nested device ops


@dataclass
class Dispatch:
    """One outermost call into jitted code on a host thread."""

    name: str
    thread: str
    start_ns: float
    duration_ns: float
    device_ns: float = 0.0  # device ops that ran inline, inside the call (CPU platform)
    compile_ns: float = 0.0  # lowering and XLA compile inside the call
    xla_compiles: int = 0
    caller: Frame | None = None  # innermost user frame around the call
    via_library: bool = False  # the frame right around the call is library code (an operator, a numpy function)
    traced_user_function: bool = False  # the call traced a user function of the same name
    executed: bool = False  # it ran a program (calls made while tracing another function run nothing)

    @property
    def host_ns(self) -> float:
        return max(self.duration_ns - self.device_ns - self.compile_ns, 0.0)


@dataclass
class OrphanCompile:
    """Lowering or compilation outside any dispatch (ahead-of-time `.lower().compile()`)."""

    duration_ns: float
    xla_compile: bool


@dataclass
class _Extent:
    """First start and last end of all events: the window when the trace does not record its own."""

    start_ns: float = float("inf")
    end_ns: float = float("-inf")

    def add(self, start: float, end: float) -> None:
        self.start_ns = min(self.start_ns, start)
        self.end_ns = max(self.end_ns, end)

    @property
    def empty(self) -> bool:
        return self.end_ns < self.start_ns


@dataclass
class TraceData:
    files: list[Path]
    run_dir: Path
    start_time_ns: int | None  # session start, ns since the epoch, when the trace says
    duration_ns: float
    window_start_ns: float = 0.0  # where the window starts on the events' time axis
    ops: list[DeviceOp] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    orphan_compiles: list[OrphanCompile] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # every device seen, with or without ops
    hosts: list[str] = field(default_factory=list)
    has_python_frames: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    other_runs: list[Path] = field(default_factory=list)  # runs in the same folder not read


MAX_XPLANE_BYTES = 8 << 30  # read whole into memory by jaxlib


# --- finding the files --------------------------------------------------------------------------

def find_trace_files(path: Path) -> tuple[Path, list[Path], list[Path]]:
    """(run folder, its xplane files, other run folders) for a file, a run folder or a log folder.

    Raises UsageError naming what was expected when there is no trace there.
    """
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    if not path.is_file() and not path.is_dir():
        raise UsageError(f"{path} is not a trace: expected a *{XPLANE_SUFFIX} file or a folder holding them")
    if path.is_file():
        if not path.name.endswith(XPLANE_SUFFIX):
            raise UsageError(f"{path} is not a trace: expected a *{XPLANE_SUFFIX} file or a folder holding them")
        return path.parent, [path], []
    runs: dict[Path, list[Path]] = {}
    for file in _walk_xplanes(path):
        runs.setdefault(file.parent, []).append(file)
    if not runs:
        if not any(path.iterdir()):
            raise UsageError(f"{path} is empty: no trace in it (jax.profiler writes "
                             f"plugins/profile/<run>/<host>{XPLANE_SUFFIX})")
        if any(path.rglob("*.trace.json.gz")):
            raise UsageError(f"{path} holds only trace.json.gz files; tpu-profile reads the XSpace files "
                             f"(*{XPLANE_SUFFIX}) that jax.profiler writes next to them")
        raise UsageError(f"{path} is not a trace folder: no *{XPLANE_SUFFIX} file in it "
                         "(jax.profiler writes plugins/profile/<run>/<host>.xplane.pb)")
    # Run folders are named by their start time (YYYY_MM_DD_HH_MM_SS); the latest sorts last.
    ordered = sorted(runs, key=lambda run: (run.name, max(f.stat().st_mtime for f in runs[run])))
    latest = ordered[-1]
    return latest, sorted(runs[latest]), ordered[:-1]


def _walk_xplanes(root: Path) -> list[Path]:
    found = []
    base_depth = len(root.parts)
    for folder, dirs, files in os.walk(root):
        if len(Path(folder).parts) - base_depth >= _MAX_SEARCH_DEPTH:
            dirs[:] = []
        found += [Path(folder) / f for f in files if f.endswith(XPLANE_SUFFIX)]
    return found


# --- reading --------------------------------------------------------------------------------------

def _profile_data_class() -> Any:
    """jaxlib's XSpace reader, without importing jax (a second of CPU) when this jaxlib has it apart."""
    try:
        from jaxlib._profile_data import ProfileData  # what jax.profiler.ProfileData is
    except ImportError:
        from jax.profiler import ProfileData
    return ProfileData


def read_trace(path: Path, classifier: FrameClassifier | None = None) -> TraceData:
    """Read the latest trace under `path` (a file, a run folder or a log folder)."""
    run_dir, files, others = find_trace_files(path)
    profile_data = _profile_data_class()
    classifier = classifier or FrameClassifier()
    data = TraceData(files=files, run_dir=run_dir, start_time_ns=None, duration_ns=0.0, other_runs=others)
    extent = _Extent()
    starts: list[int] = []
    stops: list[int] = []
    for file in files:
        host = file.name[: -len(XPLANE_SUFFIX)]
        if not file.is_file() or file.stat().st_size > MAX_XPLANE_BYTES:  # a FIFO would block, a huge file OOM
            raise UsageError(f"{file} is not a trace file tpu-profile reads (not a regular file, or over "
                             f"{MAX_XPLANE_BYTES >> 30} GiB)")
        try:
            profile = profile_data.from_file(str(file))
        except Exception as error:  # jaxlib raises RuntimeError for a truncated or foreign file
            raise RuntimeFailure(f"{file} is not a readable trace (truncated or not an XSpace file): "
                                 f"{first_line(error)}") from error
        data.hosts.append(host)
        prefix = f"{host}/" if len(files) > 1 else ""
        for plane in profile.planes:
            _read_plane(plane, prefix, data, classifier, extent, starts, stops)
    if extent.empty and not data.devices:
        raise RuntimeFailure(f"{files[0]} holds no events: the trace is empty")
    if starts and stops:
        data.start_time_ns = min(starts)
        data.duration_ns = float(max(stops) - min(starts))
    elif not extent.empty:
        data.window_start_ns = extent.start_ns
        data.duration_ns = extent.end_ns - extent.start_ns
    data.devices = sorted(set(data.devices), key=_device_sort_key)
    data.dispatches = [d for d in data.dispatches if d.executed]
    return data


def _stats(item) -> dict:
    """An event's or plane's stats; a value that is not text (serialised options) is skipped."""
    found = {}
    iterator = iter(item.stats)
    for _ in range(1000):
        try:
            key, value = next(iterator)
        except StopIteration:
            break
        except UnicodeDecodeError:
            continue
        found[key] = value
    return found


def _device_sort_key(device: str) -> tuple[str, int, str]:
    head, _, index = device.rpartition(":")
    return (head, int(index), device) if ascii_digits(index) else (device, -1, device)


def _read_plane(plane, prefix: str, data: TraceData, classifier: FrameClassifier, extent: _Extent,
                starts: list[int], stops: list[int]) -> None:
    name = plane.name
    stats = _stats(plane)
    if name == "Task Environment":
        if "profile_start_time" in stats and "profile_stop_time" in stats:
            starts.append(int(stats["profile_start_time"]))
            stops.append(int(stats["profile_stop_time"]))
        return
    if name == "/host:metadata":
        data.metadata.update({k: str(v) for k, v in stats.items()})
        return
    if name.startswith("/device:"):
        _read_device_plane(plane, prefix + name[len("/device:"):], data, extent)
    elif name.startswith("/host:"):
        for line in plane.lines:
            _read_host_line(line, prefix, data, classifier, extent)


def _read_device_plane(plane, device: str, data: TraceData, extent: _Extent) -> None:
    data.devices.append(device)
    lines = {line.name: line for line in plane.lines}
    if "XLA Ops" in lines:
        modules = [(e.start_ns, e.start_ns + e.duration_ns, e.name) for e in lines["XLA Modules"].events] \
            if "XLA Modules" in lines else []
        op_lines = [lines["XLA Ops"]]
    else:
        modules = []
        op_lines = [line for line in plane.lines if not line.name.startswith(_DEVICE_META_LINES)]
    for line in op_lines:
        stack: list[DeviceOp] = []
        module_index = 0
        for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
            start, duration = event.start_ns, event.duration_ns
            stats = _stats(event)
            module = stats.get("hlo_module")
            if module is None and modules:
                while module_index < len(modules) and modules[module_index][1] <= start:
                    module_index += 1
                if module_index < len(modules) and modules[module_index][0] <= start:
                    module = modules[module_index][2]
            op = DeviceOp(device, _module_name(module), str(stats.get("hlo_op", event.name)), start, duration,
                          duration)
            while stack and stack[-1].start_ns + stack[-1].duration_ns <= start:
                stack.pop()
            if stack:
                stack[-1].self_ns = max(stack[-1].self_ns - duration, 0.0)
            stack.append(op)
            data.ops.append(op)
            extent.add(start, start + duration)


def _module_name(module: object) -> str | None:
    """TPU traces name module runs "jit_step(1234)"; keep the program name."""
    if module is None:
        return None
    text = str(module)
    if text.endswith(")") and "(" in text:
        head, _, tail = text.rpartition("(")
        if tail[:-1].isdigit():
            return head
    return text


@dataclass
class _Open:
    """An event still open while a host line is scanned in time order."""

    end_ns: float
    frame: Frame | None = None  # a Python frame
    dispatch: Dispatch | None = None  # an outermost dispatch
    op: DeviceOp | None = None
    compile_event: bool = False


def _read_host_line(line, prefix: str, data: TraceData, classifier: FrameClassifier, extent: _Extent) -> None:  # noqa: C901 one pass: every kind of event reads and pushes the one stack of open events
    thread = line.name
    stack: list[_Open] = []
    current: Dispatch | None = None  # the outermost dispatch open on this line
    for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
        start, duration = event.start_ns, event.duration_ns
        end = start + duration
        while stack and stack[-1].end_ns <= start:
            closed = stack.pop()
            if closed.dispatch is not None:
                current = None
        name = event.name
        extent.add(start, end)
        if name.startswith("$"):
            data.has_python_frames = True
            frame = parse_frame(name)
            if current is not None and frame is not None and classifier.is_user(frame) \
                    and frame.function == current.name:
                current.traced_user_function = True
            stack.append(_Open(end, frame=frame))
            continue
        if name.startswith(DISPATCH_PREFIXES):
            if current is None:
                current = Dispatch(name[name.index("(") + 1:-1], thread, start, duration)
                python_frames = [entry.frame for entry in stack if entry.frame is not None]
                current.caller = next((f for f in reversed(python_frames) if classifier.is_user(f)), None)
                current.via_library = bool(python_frames) and not classifier.is_user(python_frames[-1])
                data.dispatches.append(current)
                stack.append(_Open(end, dispatch=current))
            else:
                stack.append(_Open(end))
            continue
        if current is not None and "Execute" in name:
            current.executed = True
        if name in COMPILE_EVENT_NAMES:
            is_xla = name == XLA_COMPILE_EVENT
            if current is not None:
                if not any(entry.compile_event for entry in stack):
                    current.compile_ns += duration
                current.xla_compiles += is_xla
            elif not any(entry.compile_event for entry in stack):
                data.orphan_compiles.append(OrphanCompile(duration, is_xla))
            stack.append(_Open(end, compile_event=True))
            continue
        stats = _stats(event)
        hlo_op = stats.get("hlo_op")
        if hlo_op is None:
            stack.append(_Open(end))
            continue
        device = f"{prefix}cpu:{stats.get('device_ordinal', 0)}"
        op = DeviceOp(device, _module_name(stats.get("hlo_module")), str(hlo_op), start, duration, duration)
        parent_op = next((entry.op for entry in reversed(stack) if entry.op is not None), None)
        if parent_op is not None:
            parent_op.self_ns = max(parent_op.self_ns - duration, 0.0)
        elif current is not None:
            current.device_ns += duration
        if current is not None:
            current.executed = True
        data.ops.append(op)
        data.devices.append(device)
        stack.append(_Open(end, op=op))
