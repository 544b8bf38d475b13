"""The agent snapshot (schema `tpu-tools/agent/v1`): what an in-job agent answers, as typed records.

An agent is another process, so its answer is outside data: it is decoded straight into these records
(`msgspec.json.decode(payload, type=AgentSnapshot)`), and whatever does not fit their types and bounds is one
error for that agent. Counts, bytes and seconds are `ge=0`, every float is finite (the bounds of a double refuse
NaN and the infinities), lists have a most number of items. A text's `max_length` is where it is cut, not a
reason to refuse the answer (`agent_snapshot.decode_snapshot` cuts it): a command line or an error message of a
megabyte is still the job's. Fields absent from an answer (an older agent) are None.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import msgspec

SCHEMA = "tpu-tools/agent/v1"
MAX_TEXT = 1 << 16  # characters of a text without a tighter bound: a command line or an error message
MAX_DEPTH = 64  # containers below a free-form field (an SDK metric's answer)

_BIGGEST = sys.float_info.max
_LARGEST = (1 << 63) - 1  # an integer past int64 is no figure an agent sends
Count = Annotated[int, msgspec.Meta(ge=0, le=_LARGEST)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=_LARGEST)]
Integer = Annotated[int, msgspec.Meta(le=_LARGEST)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=_BIGGEST)]
Figure = Annotated[float, msgspec.Meta(ge=0.0, le=_BIGGEST)]  # a non-negative figure: percent, FLOPs, a price
Number = Annotated[float, msgspec.Meta(ge=-_BIGGEST, le=_BIGGEST)]  # any finite number (a time since the epoch)
Index = Annotated[int, msgspec.Meta(ge=0, le=_LARGEST)]


Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Name = Annotated[str, msgspec.Meta(max_length=256)]
Path = Annotated[str, msgspec.Meta(max_length=4096)]
Message = Annotated[str, msgspec.Meta(max_length=512)]


def check_free_form(value: Any, depth: int = 0) -> None:
    """Raise ValueError where a free-form value (kept as data) holds a number that is not finite or nests deeper
    than MAX_DEPTH: what a JSON decoder that reads NaN hands over is checked as the typed fields are."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"expected a finite number, got {value}")
    elif isinstance(value, (list, dict)):
        if depth >= MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        for item in value.values() if isinstance(value, dict) else value:
            check_free_form(item, depth + 1)


class Device(msgspec.Struct, kw_only=True):
    """One device of the job, as its runtime sees it (what the devices group pairs devices with chips by)."""

    id: Index
    local_hardware_id: Integer | None = None
    platform: Name
    device_kind: Name
    process_index: Index | None = None
    host: Name | None = None
    coords: Annotated[list[Integer], msgspec.Meta(max_length=8)] | None = None
    core_on_chip: Index | None = None
    memory_limit_bytes: Bytes | None = None
    memory_used_bytes: Bytes | None = None
    memory_peak_bytes: Bytes | None = None
    live_array_bytes: Bytes | None = None
    live_array_count: Count | None = None


class CompileCounts(msgspec.Struct, kw_only=True):
    """Compiles and traces, of a job or of one function, and the seconds they took."""

    compile_count: Count | None = None
    recompile_count: Count | None = None
    trace_count: Count | None = None
    trace_time_s: Seconds | None = None
    lowering_time_s: Seconds | None = None
    backend_compile_time_s: Seconds | None = None
    cache_hits: Count | None = None
    cache_misses: Count | None = None

    @property
    def compile_time_s(self) -> float:
        """Tracing, lowering and backend compiling together (a phase not reported counts 0)."""
        return sum(seconds or 0.0 for seconds in (self.trace_time_s, self.lowering_time_s,
                                                  self.backend_compile_time_s))


class Function(CompileCounts, kw_only=True):
    """One jitted function's compiles and traces."""

    name: Path | None = None
    last_recompile_reason: Text | None = None


class Recompile(msgspec.Struct, kw_only=True):
    """One recompile, and why."""

    function: Path | None = None
    time_unix_s: Number | None = None
    compile_count: Count | None = None
    backend_compile_time_s: Seconds | None = None
    reason: Text | None = None


class Compiles(CompileCounts, kw_only=True):
    """The job's compiles, traces and cache use; `in_memory_cache_hits` is torch_xla's."""

    listening: bool | None = None
    in_memory_cache_hits: Count | None = None
    functions: list[Function] | None = None
    recent_recompiles: list[Recompile] | None = None


class Executions(msgspec.Struct, kw_only=True):
    """torch_xla's executions (a JAX job's are None)."""

    count: Count | None = None
    time_s: Seconds | None = None


class Transfer(msgspec.Struct, kw_only=True):
    """torch_xla's transfers one way."""

    count: Count | None = None
    time_s: Seconds | None = None
    bytes: Bytes | None = None


class Transfers(msgspec.Struct, kw_only=True):
    to_device: Transfer | None = None
    from_device: Transfer | None = None


class CpuFallbackOp(msgspec.Struct, kw_only=True):
    op: Name
    count: Count | None = None


class CpuFallbacks(msgspec.Struct, kw_only=True):
    """torch_xla's operations that ran on the CPU instead of the device."""

    total: Count | None = None
    ops: Annotated[list[CpuFallbackOp], msgspec.Meta(max_length=1024)] | None = None


class CacheMiss(msgspec.Struct, kw_only=True):
    """A persistent compilation cache miss and what differed from the closest key."""

    module: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    key: Annotated[str, msgspec.Meta(max_length=1200)] | None = None
    time_unix_s: Number | None = None
    differing: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=32)] | None = None
    explanation: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class SetTooLate(msgspec.Struct, kw_only=True):
    """A cache setting changed after the cache was in use: what is in effect and what was asked."""

    setting: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    in_effect: Path | None = None
    now: Path | None = None
    message: Message | None = None


class CompilationCache(msgspec.Struct, kw_only=True):
    """The job's persistent compilation cache: where it is, and its lookups."""

    listening: bool | None = None
    dir_configured: Path | None = None
    dir_in_use: Path | None = None
    lookups: Count | None = None
    hits: Count | None = None
    misses: Count | None = None
    entries_written: Count | None = None
    seconds_saved_s: Seconds | None = None
    key_records_written: Count | None = None
    key_record_error: Message | None = None
    host: Name | None = None
    deserialize_failures: Count | None = None
    recent_misses: Annotated[list[CacheMiss], msgspec.Meta(max_length=64)] | None = None
    set_too_late: Annotated[list[SetTooLate], msgspec.Meta(max_length=8)] | None = None


class Steps(msgspec.Struct, kw_only=True):
    """The job's training steps: rate and step times."""

    count: Count | None = None
    steps_per_second: Seconds | None = None
    last_step_time_s: Seconds | None = None
    p50_step_time_s: Seconds | None = None
    p99_step_time_s: Seconds | None = None
    last_step_age_s: Seconds | None = None


class GoodputSpan(msgspec.Struct, kw_only=True):
    """Goodput over one span (since the start, or recent): seconds and percent by cause, MFU, throughput, cost."""

    wall_s: Seconds | None = None
    goodput_percent: Figure | None = None
    causes_s: Annotated[dict[str, Seconds], msgspec.Meta(max_length=32)] | None = None
    causes_percent: Annotated[dict[str, Figure], msgspec.Meta(max_length=32)] | None = None
    flops: Figure | None = None
    samples: Figure | None = None
    flops_per_s: Figure | None = None
    mfu_percent: Figure | None = None
    samples_per_s: Figure | None = None
    cost_per_million_samples: Figure | None = None


class StepProgram(msgspec.Struct, kw_only=True):
    name: Name | None = None
    flops: Figure | None = None


class Goodput(msgspec.Struct, kw_only=True):
    """The job's goodput ledger (tpu_tools.agent.goodput)."""

    started_unix_s: Number | None = None
    steps: Count | None = None
    median_step_time_s: Seconds | None = None
    idle_threshold_s: Seconds | None = None
    step_flops: Figure | None = None
    step_flops_source: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    step_programs: Annotated[list[StepProgram], msgspec.Meta(max_length=16)] | None = None
    since_start: GoodputSpan | None = None
    recent: GoodputSpan | None = None
    window_s: Seconds | None = None
    rejected: Annotated[dict[str, Count], msgspec.Meta(max_length=16)] | None = None
    last_error: Message | None = None
    peak_flops_per_s: Figure | None = None
    peak_source: Name | None = None
    price_per_hour: Figure | None = None
    problems: Annotated[list[Message], msgspec.Meta(max_length=16)] | None = None


class Metric(msgspec.Struct, kw_only=True):
    """One value the job published with `tpu_tools.agent.metric`."""

    name: Annotated[str, msgspec.Meta(max_length=128)]
    value: Number | None = None
    step: Count | None = None
    scope: Literal["global", "local"] | None = None
    kind: Literal["replicated", "local", "host"]
    devices: Count | None = None
    job_devices: Count | None = None
    time_unix_s: Number | None = None
    suspect: Name | None = None


class Metrics(msgspec.Struct, kw_only=True):
    values: Annotated[list[Metric], msgspec.Meta(max_length=256)] | None = None
    rejected: Count | None = None
    last_error: Message | None = None


class Allocation(msgspec.Struct, kw_only=True):
    """Device memory held by arrays of one shape, dtype and sharding, made at one place."""

    shape: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    dtype: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    sharding: Path | None = None
    source: Path | None = None
    bytes: Bytes | None = None
    count: Count | None = None


class AllocationSite(msgspec.Struct, kw_only=True):
    source: Path | None = None
    bytes: Bytes | None = None
    count: Count | None = None


class Arrays(msgspec.Struct, kw_only=True):
    """The answer to the "arrays" request (tpu_tools.agent.arrays): device memory by allocation, on request only."""

    arrays: Annotated[list[Allocation], msgspec.Meta(max_length=1000)] | None = None
    arrays_looked_at: Count | None = None
    truncated: bool | None = None
    sites: Annotated[list[AllocationSite], msgspec.Meta(max_length=1000)] | None = None
    sites_error: Text | None = None
    elapsed_s: Seconds | None = None


class Frame(msgspec.Struct, kw_only=True):
    file: Path | None = None
    line: Index | None = None
    function: Annotated[str, msgspec.Meta(max_length=1024)] | None = None


class Thread(msgspec.Struct, kw_only=True):
    name: Name | None = None
    id: Integer | None = None
    main: bool | None = None
    daemon: bool | None = None
    frames: Annotated[list[Frame], msgspec.Meta(max_length=256)] | None = None


class Stacks(msgspec.Struct, kw_only=True):
    """The answer to the "stacks" request (tpu_tools.agent.stacks), also what faulthandler's text is read into."""

    time_unix_s: Number | None = None
    threads: Annotated[list[Thread], msgspec.Meta(max_length=1024)] | None = None


class Runtime(msgspec.Struct, kw_only=True):
    platform: Name
    platform_version: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    process_index: Index | None = None
    process_count: Annotated[int, msgspec.Meta(ge=1, le=_LARGEST)] | None = None
    live_arrays_age_s: Seconds | None = None


class ProcessFigures(msgspec.Struct, kw_only=True):
    """The job's process as the agent sees it."""

    cpu_percent: Figure | None = None
    cpu_time_s: Seconds | None = None
    rss_bytes: Bytes | None = None
    threads: Count | None = None


class StartupFinding(msgspec.Struct, kw_only=True):
    """A finding of the startup contract (tpu_tools.agent.xlastartup)."""

    check: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    message: Message
    fix: Message | None = None


class TpuSdk(msgspec.Struct, kw_only=True):
    """libtpu's SDK metrics read in the job (tpu_tools.agent.tpusdk); kept as data, checked where they are used."""

    status: Name | None = None
    metrics: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] | None = None
    tensorcore_utilization_percent: Annotated[list[Any], msgspec.Meta(max_length=1024)] | None = None
    read_age_s: Figure | None = None

    def __post_init__(self) -> None:
        check_free_form(self.metrics)
        check_free_form(self.tensorcore_utilization_percent)


class JobIdentity(msgspec.Struct, kw_only=True):
    """The job the process is one process of, across restarts and hosts (tpu_tools.agent.joblog): its name, where
    the name came from, the process's place in it, its log, and the step and last checkpoint the agent saw."""

    id: Annotated[str, msgspec.Meta(max_length=200)]
    source: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    worker: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    log: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    step: Count | None = None
    last_checkpoint_step: Count | None = None
    log_error: Message | None = None


class AgentSnapshot(msgspec.Struct, kw_only=True):
    """One agent's answer: the job, its runtime and devices, compiles, steps, goodput, cache and metrics."""

    schema: Annotated[str, msgspec.Meta(max_length=64)]
    pid: Annotated[int, msgspec.Meta(ge=1, le=_LARGEST)]
    tag: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    user: Name | None = None
    command: Text | None = None
    agent_version: Name | None = None
    started_unix_s: Number | None = None
    uptime_s: Number | None = None
    jax_version: Name | None = None
    frontend: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    frontend_version: Name | None = None
    explain_recompiles: bool | None = None
    runtime: Runtime | None = None
    devices: Annotated[list[Device], msgspec.Meta(max_length=4096)] | None = None
    memory_error: Text | None = None
    process: ProcessFigures | None = None
    compiles: Compiles | None = None
    compilation_cache: CompilationCache | None = None
    executions: Executions | None = None
    transfers: Transfers | None = None
    cpu_fallbacks: CpuFallbacks | None = None
    startup: Annotated[list[StartupFinding], msgspec.Meta(max_length=16)] | None = None
    steps: Steps | None = None
    tpu_sdk: TpuSdk | None = None
    goodput: Goodput | None = None
    metrics: Metrics | None = None
    error: Text | None = None  # the agent could not make its snapshot
    arrays_report: Arrays | None = None
    arrays_error: Text | None = None
    stacks: Stacks | None = None
    stacks_signal: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None  # faulthandler writes agent-<pid>.stacks
    published_unix_s: Number | None = None  # read from the snapshot file (tpu_tools.metrics.snapfile)
    publish_error: Message | None = None
    job: JobIdentity | None = None  # tpu_tools.agent.joblog
