"""The reads behind `tpu_tools.api`: devices, free chips, libtpu's metrics, the jobs' agents. Never imports jax."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tpu_tools.instrument.steps import StepStats
from tpu_tools.inventory import DeviceSummary, build_inventory
from tpu_tools.metrics.agent_client import AgentResult, query_agents, query_snapshot
from tpu_tools.metrics.libtpu import read_once
from tpu_tools.metrics.libtpu.addresses import metrics_addresses
from tpu_tools.metrics.libtpu.records import LibtpuSnapshot
from tpu_tools.metrics.records.agent import AgentSnapshot, Steps
from tpu_tools.pjrt.placement import FreeChips
from tpu_tools.pjrt.runtime import RuntimePolicy

DEFAULT_TIMEOUT_S = 5.0
AGENT_TIMEOUT_S = 2.0
METRICS_TIMEOUT_S = 1.0


def devices(*, runtime: bool = False, platform: str = "auto", metrics: bool = True,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> list[DeviceSummary]:
    """Every accelerator of this host with its memory, utilization and the processes holding it.

    `runtime=True` also asks PJRT (in a child process, within `timeout_s`; never while another process holds
    the TPU), which adds the PJRT device ids and, on a host without accelerators, lists the CPU platform's
    devices. `metrics=False` leaves libtpu's metrics service unasked (HBM use, duty cycle of a running job).
    """
    inventory = build_inventory(RuntimePolicy(platform=platform), timeout_s=timeout_s, use_runtime=runtime,
                                metrics_addresses=metrics_addresses() if metrics else (),
                                metrics_timeout_s=min(timeout_s, METRICS_TIMEOUT_S))
    return inventory.summaries()


def free_chips(*, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[FreeChips]:
    """Per platform, the chips no process holds and the environment that pins a new job to them (`tpu-ls
    --free`): `FreeChips.environment` is ready for `subprocess.run(..., env={**os.environ, **environment})`."""
    return build_inventory(RuntimePolicy(), timeout_s=timeout_s, use_runtime=False).free_chips()


def libtpu_metrics(addresses: Sequence[str] = (), *, timeout_s: float = METRICS_TIMEOUT_S) -> list[LibtpuSnapshot]:
    """libtpu's runtime metrics service, one snapshot per address: localhost:8431, every port of
    TPU_RUNTIME_METRICS_PORTS and `addresses`. An address that does not answer has its `error` set."""
    snapshots, _ = read_once(metrics_addresses(addresses), timeout_s)
    return snapshots


@dataclass
class Job:
    """A process running the tpu-tools agent, with the figures its agent gives (None where unknown)."""

    pid: int
    tag: str | None
    error: str | None = None  # why the agent did not answer; the figures are then None
    user: str | None = None
    command: str | None = None
    platform: str | None = None
    jax_version: str | None = None
    uptime_s: float | None = None
    steps: StepStats | None = None
    compile_count: int | None = None
    recompile_count: int | None = None
    compile_time_s: float | None = None
    device_memory_used_bytes: list[int | None] = field(default_factory=list)  # per device of the job
    goodput_percent: float | None = None  # since the job started
    mfu_percent: float | None = None  # since the job started
    snapshot: AgentSnapshot | None = field(default=None, repr=False)  # the whole answer, as its record

    @property
    def steps_per_s(self) -> float | None:
        """Steps per second lately, from the agent's step statistics; None when the job marks no steps."""
        return self.steps.steps_per_second if self.steps is not None else None


def _job(pid: int, snapshot: AgentSnapshot | None, error: str | None) -> Job:
    if snapshot is None:
        return Job(pid, None, error=error)
    compiles = snapshot.compiles
    since_start = snapshot.goodput.since_start if snapshot.goodput is not None else None
    return Job(
        pid=pid, tag=snapshot.tag, error=error, user=snapshot.user, command=snapshot.command,
        platform=snapshot.runtime.platform if snapshot.runtime is not None else None,
        jax_version=snapshot.jax_version, uptime_s=snapshot.uptime_s,
        steps=_steps(snapshot.steps) if snapshot.steps is not None else None,
        compile_count=compiles.compile_count if compiles is not None else None,
        recompile_count=compiles.recompile_count if compiles is not None else None,
        compile_time_s=compiles.compile_time_s if compiles is not None else None,
        device_memory_used_bytes=[d.memory_used_bytes for d in snapshot.devices or []],
        goodput_percent=since_start.goodput_percent if since_start is not None else None,
        mfu_percent=since_start.mfu_percent if since_start is not None else None,
        snapshot=snapshot)


def _steps(steps: Steps) -> StepStats:
    return StepStats(count=steps.count or 0, steps_per_second=steps.steps_per_second,
                     last_step_time_s=steps.last_step_time_s, p50_step_time_s=steps.p50_step_time_s,
                     p99_step_time_s=steps.p99_step_time_s, last_step_age_s=steps.last_step_age_s)


def _from_result(result: AgentResult) -> Job:
    return _job(result.pid, result.snapshot, result.error)


def jobs(*, tag: str | None = None, timeout_s: float = AGENT_TIMEOUT_S) -> list[Job]:
    """Every job of this user running the agent (`python -m tpu_tools.agent`, or `tpu_tools.agent.start()`),
    asked in parallel, each within `timeout_s`; `tag`: a regular expression its tag must contain."""
    return [_from_result(result) for result in query_agents(timeout_s, tag_filter=tag).results]


def job(pid: int, *, timeout_s: float = AGENT_TIMEOUT_S) -> Job:
    """The figures of the job `pid`'s agent; raises `tpu_tools.metrics.agent_client.AgentQueryError` (AgentGone
    when no agent runs there)."""
    return _job(pid, query_snapshot(pid, timeout_s), None)
