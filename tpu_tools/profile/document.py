"""The profile summary (`tpu-tools/profile/v1`) as typed records, in its JSON key order.

A summary is built in-process (`summary.build_summary`) or read back from a summary.json, which is outside
input: it is decoded into these records, so every figure the report shows has been checked for its type.
Sections a summary does not have are None (or empty); unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec


class ProgramRecord(msgspec.Struct, kw_only=True):
    """The program `tpu-profile run` ran."""

    argv: Annotated[list[str], msgspec.Meta(min_length=1)]
    module: str | None
    status: str  # "exited", "raised" or "interrupted"
    exit_code: int | None
    error: str | None
    wall_time_s: float | None


class WindowRecord(msgspec.Struct, kw_only=True):
    """The trace window asked for and what it covered (profile.window.WindowResult)."""

    mode: str | None  # "time", "steps" or None: the whole run
    delay_s: float
    duration_s: float | None
    start_step: int | None = None
    steps: int | None = None
    opened: bool = False
    opened_at_s: float | None  # since the program started
    closed_at_s: float | None
    first_step: int | None
    last_step: int | None
    closed_by: str | None
    note: str | None


class TraceRecord(msgspec.Struct, kw_only=True):
    dir: str
    run_dir: str | None
    xplane_files: list[str] = []
    perfetto_file: str | None
    start_time: str | None = None  # ISO 8601 UTC
    duration_us: float
    hosts: list[str]
    python_frames: bool | None = None
    jax_version: str | None = None


class DeviceBusy(msgspec.Struct, kw_only=True):
    device: str
    op_count: int
    busy_us: float
    idle_us: float | None
    busy_percent: float | None


class OpTime(msgspec.Struct, kw_only=True):
    name: str
    module: str | None
    count: int
    total_us: float
    mean_us: float
    percent_of_device_time: float | None


class ModuleTime(msgspec.Struct, kw_only=True):
    name: str | None
    op_count: int
    total_us: float
    percent_of_device_time: float | None


class HostDispatch(msgspec.Struct, kw_only=True):
    dispatches: int
    dispatch_time_us: float | None
    mean_dispatch_us: float | None
    compiling_dispatches: int
    compiling_dispatch_time_us: float | None


class CompileFigures(msgspec.Struct, kw_only=True):
    """One function's compiles; figures a source does not record (the trace has no trace time) are None."""

    function: str
    defined_at: str | None
    compiles: int | None
    traces: int | None
    compile_time_s: float | None
    trace_time_s: float | None
    lowering_time_s: float | None
    xla_compile_time_s: float | None
    persistent_cache_hits: int | None
    calls: int | None  # dispatches seen in the trace window
    cache_hits: int | None


class RecompileReason(msgspec.Struct, kw_only=True):
    reason: str
    count: int
    call_sites: list[str]


class RecompileGroup(msgspec.Struct, kw_only=True):
    function: str
    defined_at: str | None
    recompiles: int
    reasons: list[RecompileReason]


class EagerOp(msgspec.Struct, kw_only=True):
    name: str
    count: int
    host_time_us: float


class EagerSite(msgspec.Struct, kw_only=True):
    call_site: str | None
    function: str | None
    file: str | None
    line: int | None
    dispatches: int
    host_time_us: float
    ops: dict[str, int] = {}  # op name -> dispatches, most first


class EagerDispatch(msgspec.Struct, kw_only=True):
    dispatches: int
    host_time_us: float
    ops: list[EagerOp]
    call_sites: list[EagerSite]


class ProfileSummary(msgspec.Struct, kw_only=True):
    """summary.json and `tpu-profile run|summary|capture --json`."""

    schema: str
    source: str | None = None  # "run", "trace" or "capture"
    created: str | None = None
    host: str | None = None
    versions: dict[str, Any] | None = None  # versions.StackVersions, as written
    program: ProgramRecord | None = None
    window: WindowRecord | None = None
    trace: TraceRecord | None = None
    devices: list[DeviceBusy] | None = None
    device_time_us: float | None = None
    top_ops: list[OpTime] | None = None
    modules: list[ModuleTime] | None = None
    host_dispatch: HostDispatch | None = None
    compile_source: str | None = None  # "monitoring", "torch_xla" or "trace"; None: no compile records
    compiles: list[CompileFigures] | None = None
    recompilations: list[RecompileGroup] | None = None
    eager: EagerDispatch | None = None
    notes: list[str] | None = None
