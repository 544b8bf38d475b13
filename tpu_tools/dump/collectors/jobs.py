"""What the running jobs say about themselves: libtpu's runtime metrics services and the tpu-tools agents.

Neither opens a device. libtpu's services are read once (`read_once`: metrics and runtime status with
HLO locations), each call within a deadline that fits the collector's remaining time; the agents of
this user are asked for their snapshots in parallel, each within its own deadline. Nothing answering is
a skip with the reason; a service that accepts connections but does not answer in time is a timeout.
"""

from __future__ import annotations

import msgspec

from tpu_tools.dump.collector import CollectContext, Skipped, TimedOut
from tpu_tools.errors import RuntimeFailure, UsageError
from tpu_tools.metrics.records.jobs import AgentEntry, EntryCompiles, EntrySteps
from tpu_tools.render.table import Column, TableData, plain_table
from tpu_tools.units import MISSING, format_bytes

_MARGIN_S = 1.0  # left for writing the files before the runner's hard stop
# read_once costs a connection probe, then up to three deadlines (list, reads, runtime status).
_LIBTPU_DEADLINES = 4
_MIN_DEADLINE_S = 0.05
_AGENT_TIMEOUT_S = 2.0
_REFUSED = "connection refused"


def libtpu_deadline(configured_s: float, remaining_s: float) -> float:
    """The deadline of each call, so that the whole read ends within the collector's remaining time."""
    return max(_MIN_DEADLINE_S, min(configured_s, (remaining_s - _MARGIN_S) / _LIBTPU_DEADLINES))


def collect_libtpu(ctx: CollectContext) -> None:
    from tpu_tools.metrics.libtpu import read_once
    from tpu_tools.metrics.libtpu.addresses import ports_from_environment

    try:
        ports_from_environment()
    except UsageError as error:
        ctx.note(f"{error}; those ports were not read")
    addresses = list(ctx.options.metrics_addresses)
    deadline_s = libtpu_deadline(ctx.options.metrics_timeout_s, ctx.remaining_s())
    snapshots, statuses = read_once(addresses, deadline_s, runtime_status=True, include_hlo_info=True)
    statuses = statuses or []
    errors = [s.error or "" for s in snapshots]
    if all(_REFUSED in error for error in errors) and not any(s.ok for s in statuses):
        raise Skipped(f"no libtpu metrics service answered (tried {', '.join(addresses)}: {_REFUSED})")
    ctx.add_json("accelerators/libtpu.json", {
        "addresses": addresses,
        "call_timeout_s": round(deadline_s, 3),
        "metrics": [s.to_dict() for s in snapshots],
        "runtime_status": [s.to_dict() for s in statuses],
    })
    if not any(s.ok for s in snapshots) and not any(s.ok for s in statuses):
        problem = "; ".join(e for e in errors if _REFUSED not in e)
        if "did not answer within" in problem:
            raise TimedOut(problem)
        raise RuntimeFailure(problem)
    from tpu_tools.render.libtpu_view import runtime_status_views, service_device_table

    views = [service_device_table(snapshots), *runtime_status_views(statuses)]
    parts = [view if isinstance(view, str) else plain_table(view) for view in views]
    ctx.add_text("accelerators/libtpu.txt", "\n\n".join(parts) + "\n")
    for snapshot in snapshots:
        for line in snapshot.notes:
            ctx.note(f"libtpu metrics at {snapshot.address}: {line}")


def _agents_table(entries: list[AgentEntry]) -> TableData:
    table = TableData([Column("PID", "right"), Column("TAG"), Column("PLATFORM"), Column("DEVICES", "right"),
                       Column("DEVICE MEMORY", "right"), Column("COMPILES", "right"), Column("RECOMPILES", "right"),
                       Column("STEPS", "right"), Column("STEPS/S", "right"), Column("COMMAND / ERROR", max_width=60)])
    for entry in entries:
        compiles, steps = entry.compiles or EntryCompiles(), entry.steps or EntrySteps()
        rate = steps.steps_per_second
        table.add_row(entry.pid, entry.tag or MISSING, entry.platform or MISSING, len(entry.devices),
                      format_bytes(entry.device_memory_used_bytes), _cell(compiles.compile_count),
                      _cell(compiles.recompile_count), _cell(steps.count), MISSING if rate is None else f"{rate:.2f}",
                      f"error: {entry.error}" if entry.error else entry.command or MISSING)
    return table


def _cell(value: object) -> str:
    return MISSING if value is None else str(value)


def collect_agents(ctx: CollectContext) -> None:
    from tpu_tools.metrics.agent_client import query_agents
    from tpu_tools.metrics.groups.processes import agent_entry
    from tpu_tools.metrics.rundir import RunDirError, runtime_dir

    directory = runtime_dir()
    _add_jobs_ended(ctx)
    try:
        scan = query_agents(max(0.1, min(_AGENT_TIMEOUT_S, ctx.remaining_s() - _MARGIN_S)))
    except RunDirError as error:
        raise RuntimeFailure(str(error)) from error
    if not scan.results and not scan.ignored:
        raise Skipped(f"no workload of this user runs the tpu-tools agent (runtime directory {directory})")
    ctx.add_json("accelerators/agents.json", {
        "runtime_dir": str(directory),
        "agents": [{"pid": r.pid, "tag": r.tag, "socket": str(r.socket_path), "error": r.error,
                    "query_time_s": round(r.elapsed_s, 6),
                    "snapshot": msgspec.to_builtins(r.snapshot)} for r in scan.results],
        "ignored_sockets": [i.to_dict() for i in scan.ignored],
        "removed_stale_pids": scan.removed_stale,
    })
    if not scan.results:
        raise Skipped(f"no agent answered; {len(scan.ignored)} sockets in {directory} were ignored "
                      "(see accelerators/agents.json)")
    entries = [agent_entry(r) for r in scan.results]
    ctx.add_text("accelerators/agents.txt", plain_table(_agents_table(entries)) + "\n")
    _add_job_lives(ctx, entries)
    _add_stacks(ctx, [r.pid for r in scan.results if r.error is None])


def _add_stacks(ctx: CollectContext, pids: list[int]) -> None:
    """Every job's Python stacks, beside libtpu's runtime state: asked of its agent, or written by faulthandler
    for a job stuck holding its interpreter's lock (tpu_tools.agent.stacks)."""
    from tpu_tools.metrics.agent_client import AgentQueryError, query_stacks

    jobs, text = [], []
    for pid in pids:
        timeout = (ctx.remaining_s() - _MARGIN_S) / 2  # the socket, then faulthandler: each gets half
        if timeout <= _MIN_DEADLINE_S:
            jobs.append({"pid": pid, "error": "no time left in the collector"})
            continue
        try:
            answer = query_stacks(pid, min(_AGENT_TIMEOUT_S, timeout))
        except AgentQueryError as error:
            jobs.append({"pid": pid, "error": str(error)})
            text.append(f"process {pid}: {error}\n")
            continue
        jobs.append({"pid": pid, "source": answer.source, "where": answer.where,
                     "stacks": msgspec.to_builtins(answer.stacks)})
        text.append(f"process {pid} ({answer.source}), main thread in {answer.where}\n")
        for thread in answer.stacks.threads or []:
            text.append(f"  thread {thread.name}{' (main)' if thread.main else ''}\n")
            text += [f"    {f.file}:{f.line} in {f.function}\n" for f in thread.frames or []]
    if jobs:
        ctx.add_json("accelerators/stacks.json", {"jobs": jobs})
        ctx.add_text("accelerators/stacks.txt", "".join(text))


def _add_job_lives(ctx: CollectContext, entries: list[AgentEntry]) -> None:
    """The jobs across restarts the agents name, over their whole lives, read from their logs
    (`tpu-monitor --job`), when any agent names one."""
    from tpu_tools.metrics.jobreport import JobLogs

    reports = JobLogs().reports(entries)
    if reports:
        ctx.add_json("accelerators/jobs.json", {"jobs": msgspec.to_builtins(reports)})


def _add_jobs_ended(ctx: CollectContext) -> None:
    """The summaries jobs with the agent left when they ended (`tpu-monitor --jobs-ended`), when there are any."""
    from tpu_tools.metrics.jobsummary import read_summaries, summaries_dir

    records, errors = read_summaries()
    if records or errors:
        ctx.add_json("accelerators/jobs_ended.json", {"directory": str(summaries_dir()), "jobs": records,
                                                      "errors": errors})
