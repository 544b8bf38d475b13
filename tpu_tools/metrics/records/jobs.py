"""The report's jobs: the `processes` group (one entry per agent-attached process, device holders without an
agent, and the findings across jobs) and the `workload` group (what the job and the node serve besides libtpu
and the agents).

An agent entry carries the figures of its agent's snapshot (`records.agent`) that the views show, in the
report's JSON key order; where the agent did not answer, its `error` says why and its figures are None.
"""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.agent import (
    CompilationCache,
    CompileCounts,
    CpuFallbacks,
    Executions,
    Function,
    GoodputSpan,
    JobIdentity,
    Recompile,
    StartupFinding,
    StepProgram,
    Transfers,
)
from tpu_tools.metrics.records.group import GroupRecord


class AgentDevice(msgspec.Struct, kw_only=True):
    """One device of an agent's job, with what it holds there."""

    id: int | None = None
    platform: str | None = None
    device_kind: str | None = None
    memory_used_bytes: int | None = None
    memory_peak_bytes: int | None = None
    memory_limit_bytes: int | None = None
    live_array_bytes: int | None = None
    live_array_count: int | None = None


class EntryCompiles(CompileCounts, kw_only=True):
    """The job's compiles: its totals, each function, and the latest recompiles."""

    in_memory_cache_hits: int | None = None
    functions: list[Function] = msgspec.field(default_factory=list)
    recent_recompiles: list[Recompile] = msgspec.field(default_factory=list)


class EntrySteps(msgspec.Struct, kw_only=True):
    """The job's steps: how many, how fast, and how long since the last."""

    count: int | None = None
    steps_per_second: float | None = None
    last_step_time_s: float | None = None
    p50_step_time_s: float | None = None
    p99_step_time_s: float | None = None
    last_step_age_s: float | None = None


class IciLinkHealth(msgspec.Struct, kw_only=True):
    location: str | None = None
    tray: int | None = None
    chip: int | None = None
    port: int | None = None
    kind: str | None = None
    score: int | None = None
    state: str | None = None


class ThrottleHealth(msgspec.Struct, kw_only=True):
    device: int
    score: int
    throttled_percent: int


class ChipHealth(msgspec.Struct, kw_only=True):
    """libtpu's health scores read in the job: ICI links and throttling, and what could not be read."""

    ici_links: list[IciLinkHealth] = msgspec.field(default_factory=list)
    throttle: list[ThrottleHealth] = msgspec.field(default_factory=list)
    problems: list[str] = msgspec.field(default_factory=list)


class SdkFigures(msgspec.Struct, kw_only=True):
    """The agent's libtpu SDK read: TensorCore utilization per core, the metrics served and not, health."""

    status: str | None = None
    tensorcore_utilization_percent: list[float | None] | None = None
    metrics: list[str] = msgspec.field(default_factory=list)
    unreadable: dict[str, str] = msgspec.field(default_factory=dict)  # metric name -> why it was not read
    health: ChipHealth | None = None
    read_age_s: float | None = None


class EntryGoodput(msgspec.Struct, kw_only=True):
    """The job's goodput, with the monitor's price where the job has none (`price_source`)."""

    started_unix_s: float | None = None
    steps: int | None = None
    median_step_time_s: float | None = None
    idle_threshold_s: float | None = None
    step_flops: float | None = None
    step_flops_source: str | None = None
    step_programs: list[StepProgram] | None = None
    since_start: GoodputSpan | None = None
    recent: GoodputSpan | None = None
    window_s: float | None = None
    rejected: dict[str, int] | None = None  # figure -> values refused
    last_error: str | None = None
    peak_flops_per_s: float | None = None
    peak_source: str | None = None
    price_per_hour: float | None = None
    problems: list[str] | None = None
    price_source: str | msgspec.UnsetType = msgspec.UNSET  # "job" or "monitor"; absent where no price is known


class StackFrame(msgspec.Struct, kw_only=True):
    file: str
    line: int | None = None
    function: str | None = None


class StallStack(msgspec.Struct, kw_only=True):
    """Where a stalled job's main thread is: the job's own frame, whether inside a library, and how it was read."""

    where: str | None = None
    source: str | msgspec.UnsetType = msgspec.UNSET  # "agent" or "faulthandler"; absent where it failed
    frames: list[StackFrame] | msgspec.UnsetType = msgspec.UNSET
    in_library: bool | msgspec.UnsetType = msgspec.UNSET
    threads: int | msgspec.UnsetType = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET  # why the stacks were not read


class PodOwner(msgspec.Struct, kw_only=True):
    """The Kubernetes pod a process runs in, with the pod's labels when they are read (`--pod-labels`)."""

    namespace: str
    pod: str
    container: str | None = None
    labels: dict[str, str] | msgspec.UnsetType = msgspec.UNSET  # label name -> value


class PublishedMetric(msgspec.Struct, kw_only=True):
    """A scalar the job published (`tpu_tools.agent.metric`), as the report and the fleet view carry it."""

    name: str
    value: float | None = None
    step: int | None = None
    scope: str | None = None  # "global" or "local", as the job claimed
    kind: str | None = None  # "replicated", "local" or "host"
    devices: int | None = None
    job_devices: int | None = None
    time_unix_s: float | None = None
    suspect: str | None = None


class AgentEntry(msgspec.Struct, kw_only=True):
    """One agent-attached process: its job's figures, or why its agent did not answer (`error`)."""

    pid: int
    tag: str | None = None
    user: str | None = None
    command: str | None = None
    error: str | None = None
    socket: str | None = None
    uptime_s: float | None = None
    jax_version: str | None = None
    frontend: str | None = None
    frontend_version: str | None = None
    platform: str | None = None
    cpu_percent: float | None = None
    cpu_time_s: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    device_memory_used_bytes: int | None = None  # unknown, never 0, where no device knows it
    live_array_bytes: int | None = None
    live_array_count: int | None = None
    devices: list[AgentDevice] = msgspec.field(default_factory=list)
    compiles: EntryCompiles | None = None
    steps: EntrySteps | None = None
    compilation_cache: CompilationCache | None = None
    executions: Executions | None = None
    transfers: Transfers | None = None
    cpu_fallbacks: CpuFallbacks | None = None
    startup: list[StartupFinding] | None = None
    tpu_sdk: SdkFigures | None = None
    goodput: EntryGoodput | None = None
    process_index: int | None = None
    process_count: int | None = None
    metrics: list[PublishedMetric] = msgspec.field(default_factory=list)
    metrics_rejected: int | None = None
    metrics_error: str | None = None
    job: JobIdentity | None = None  # the job across restarts (tpu_tools.agent.joblog), null without one
    query_time_s: float | None = None
    stalled_s: float | None = None  # seconds since the last step of a job whose steps stopped
    stack: StallStack | msgspec.UnsetType = msgspec.UNSET  # only on a stalled job
    kubernetes: PodOwner | None = None
    slurm_job_id: str | None = None
    host: str | msgspec.UnsetType = msgspec.UNSET  # the host of a fleet view's entry; absent from one host's report

    @property
    def host_name(self) -> str | None:
        """The host a fleet view's entry names; None in one host's report."""
        return self.host if isinstance(self.host, str) else None


class Holder(msgspec.Struct, kw_only=True):
    """A process that holds devices without an agent: who, which chips, and its process figures."""

    pid: int
    user: str | None = None
    command: str | None = None
    chips: list[int] = msgspec.field(default_factory=list)
    cpu_percent: float | None = None
    cpu_time_s: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    kubernetes: PodOwner | None = None
    slurm_job_id: str | None = None


class CacheWriter(msgspec.Struct, kw_only=True):
    pid: int | None = None
    tag: str | None = None
    host: str | None = None
    entries_written: int = 0


class SharedCacheDir(msgspec.Struct, kw_only=True):
    """A compilation cache directory written by more than one process, and what to do about it."""

    dir: str
    writers: list[CacheWriter] = msgspec.field(default_factory=list)
    hosts: list[str] = msgspec.field(default_factory=list)
    message: str = ""


class IgnoredSocket(msgspec.Struct, kw_only=True):
    socket: str
    reason: str


class MetricWorker(msgspec.Struct, kw_only=True):
    host: str | None = None
    pid: int | None = None
    process_index: int | None = None
    value: float | None = None
    kind: str | None = None
    step: int | None = None


class GlobalMetricFinding(msgspec.Struct, kw_only=True):
    """A metric published as global whose workers disagree (or that the job marked suspect)."""

    tag: str | None = None
    name: str | None = None
    step: int | None = None
    reason: str = ""
    workers: list[MetricWorker] = msgspec.field(default_factory=list)


class StalledWorker(msgspec.Struct, kw_only=True):
    host: str | None = None
    pid: int | None = None
    process_index: int | None = None
    where: str | None = None


class StallFinding(msgspec.Struct, kw_only=True):
    """A stalled job whose workers stopped in different places: the ones that differ."""

    tag: str | None = None
    others_where: list[str] = msgspec.field(default_factory=list)
    workers: list[StalledWorker] = msgspec.field(default_factory=list)
    reason: str = ""


class JobLifeFigures(msgspec.Struct, kw_only=True):
    """Goodput over a job's whole life, across its restarts and hosts (tpu_tools.metrics.joblife): the fleet's
    view has the figures the exporter serves, its worst host's; a host's has every one."""

    wall_s: float | msgspec.UnsetType = msgspec.UNSET
    goodput_percent: float | None = None
    causes_s: dict[str, float] | msgspec.UnsetType = msgspec.UNSET  # badput cause -> seconds
    disruptions: int | None = None
    lost_progress_steps: int | None = None
    lost_progress_s: float | None = None
    recovery_s: float | None = None


class JobLife(msgspec.Struct, kw_only=True):
    """One job the agents name, over its whole life from its log (`tpu-monitor --job` has its every figure)."""

    job: str
    log: str | None = None
    state: str | None = None
    processes: int | None = None
    last_step: int | None = None
    hosts: list[str] | msgspec.UnsetType = msgspec.UNSET  # the fleet's view: the hosts whose series name it
    goodput: JobLifeFigures | None = None
    error: str | None = None


class ProcessesGroup(GroupRecord, kw_only=True):
    """The `processes` group: every agent-attached process, the holders without an agent, and the findings."""

    agents: list[AgentEntry] = msgspec.field(default_factory=list)
    shared_cache_dirs: list[SharedCacheDir] = msgspec.field(default_factory=list)
    holders: list[Holder] = msgspec.field(default_factory=list)
    ignored_sockets: list[IgnoredSocket] = msgspec.field(default_factory=list)
    pod_labels_error: str | None = None
    global_metric_findings: list[GlobalMetricFinding] = msgspec.field(default_factory=list)
    stall_findings: list[StallFinding] = msgspec.field(default_factory=list)
    jobs: list[JobLife] = msgspec.field(default_factory=list)  # the jobs across restarts the agents name


class ExportedSample(msgspec.Struct, kw_only=True):
    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # Prometheus labels, as the job served them
    value: float | None = None  # None: not finite


class ExportedFamily(msgspec.Struct, kw_only=True):
    """One metric family the job serves itself (Orbax checkpointing, Grain input pipelines)."""

    source: str  # "orbax" or "grain"
    name: str
    type: str
    documentation: str
    samples: list[ExportedSample] = msgspec.field(default_factory=list)


class JobEndpoint(msgspec.Struct, kw_only=True):
    """A port the job serves its metrics on, what was read there, or why not."""

    address: str
    sources: list[str] = msgspec.field(default_factory=list)  # which of orbax / grain this port is for
    error: str | None = None
    families: list[ExportedFamily] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class PluginAccelerator(msgspec.Struct, kw_only=True):
    """One chip as GKE's TPU device plugin reports it, with the pod that holds it."""

    accelerator_id: str
    model: str | None = None
    make: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    duty_cycle_percent: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


class PluginRead(msgspec.Struct, kw_only=True):
    """What the device plugin answered; `address` None where it was not asked (not a Kubernetes node)."""

    address: str | None = None
    error: str | None = None
    accelerators: list[PluginAccelerator] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class WorkloadGroup(GroupRecord, kw_only=True):
    """The `workload` group: the job's own metric endpoints and the TPU device plugin's read."""

    endpoints: list[JobEndpoint] = msgspec.field(default_factory=list)
    device_plugin: PluginRead | None = None

