"""The workload agent: live figures of a JAX job, served to `tpu-monitor` and `tpu-top`.

Two ways in::

    import tpu_tools.agent
    tpu_tools.agent.start(tag="train")          # in the job's code

    python -m tpu_tools.agent [--tag T] [--explain-recompiles] train.py args...   # no code change
    python -m tpu_tools.agent -m package.module args...

The agent knows, per device, memory in use / peak / limit where the platform
reports it and the bytes and count of live arrays; compile events from
`jax.monitoring` per function (tracing, lowering, backend compile, persistent
cache hits and misses); recompilations, with JAX's reason when
`explain_recompiles` is on; steps the job marks; the process's CPU %, RSS and
threads. It publishes its snapshot into a file monitors read without waking
it (`tpu_tools.agent.publish`: at most ten times a second) and answers on a
Unix socket in a private per-user directory (`tpu_tools.metrics.rundir`);
besides, only JAX's own monitoring callbacks run, and only when JAX compiles.

Step marking works with or without the server running, and is cheap (a clock
read and two deque appends)::

    for batch in data:
        state = train_step(state, batch)
        tpu_tools.agent.step()                  # marks the end of a step

    with tpu_tools.agent.step_context():        # or: time exactly this block as one step
        state = train_step(state, batch)

    tpu_tools.agent.on_step(lambda index, seconds: ...)   # called at every step boundary

Goodput, MFU and cost (`docs/goodput.md`): label the time between steps, give a step's work::

    with tpu_tools.agent.phase("data"):          # "data", "checkpoint", "eval" or a name of the job's
        batch = next(batches)
    tpu_tools.agent.step(samples=len(batch), flops=model_flops)   # both optional
    tpu_tools.agent.step_flops(train_step.lower(state, batch).compile())  # optional: FLOPs from XLA's cost analysis

Without either, a step's FLOPs are XLA's cost analysis of the programs compiled during a step.

A job across restarts (`docs/goodput.md`): name it (`start(job=...)`, `--job`, $TPU_TOOLS_JOB, else its
Kubernetes or Slurm job) and say what its checkpoints hold; its log then gives the progress each restart lost::

    tpu_tools.agent.checkpoint_restored(step)    # this process resumed from the state after `step` steps
    tpu_tools.agent.checkpoint_saved(step)       # the state after `step` steps is saved

Importing this package does not import jax: the agent attaches to jax once the
job imports it, so environment set by the script before `import jax` applies.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tpu_tools.agent.frontends import JAX, TORCH_XLA, Frontend, FrontendFigures, JaxFrontend, reported
from tpu_tools.agent.goodput import JobFigures, process_ledger, program_flops, reset_after_fork, write_job_summary
from tpu_tools.agent.metrics import process_metrics
from tpu_tools.agent.metrics import reset_after_fork as reset_metrics_after_fork
from tpu_tools.instrument.jobvalues import job_flag, job_float, job_name
from tpu_tools.instrument.steps import StepCallback, process_steps

ENV_TAG = "TPU_TOOLS_TAG"
# The process's CPU, memory and threads are read from /proc at most this often: the snapshot is published up to
# ten times a second, and that read is the largest part of a publication's cost to the job (its CPU % needs a
# window of 0.2 s or more anyway).
PROCESS_FIGURES_MAX_AGE_S = 0.5

__all__ = ["AgentError", "AgentInfo", "ENV_TAG", "checkpoint_restored", "checkpoint_saved", "current", "goodput",
           "metric", "on_step", "phase", "start", "step", "step_context", "step_count", "step_flops", "stop"]

_steps = process_steps()
_lock = threading.Lock()
_agent: _Agent | None = None


class AgentError(RuntimeError):
    """The agent could not start (its runtime directory or socket is unusable); the message says why."""


@dataclass(frozen=True)
class AgentInfo:
    """Where a running agent can be reached: what `start()` and `current()` return.

    pid: the process; tag: the job's name in monitors; socket_path: the Unix socket monitors ask;
    explain_recompiles: whether recompilations carry JAX's reason.
    """

    pid: int
    tag: str
    socket_path: Path
    explain_recompiles: bool


# --- steps: usable with or without the server ---------------------------------------------------------

def step(*, flops: float | None = None, samples: float | None = None) -> int:
    """Mark the end of a training step; returns the index of the step that ended (0 for the first).

    The step's time is the time since the previous call (unknown for the first
    call). Cheap enough to call every iteration; works without `start()`.
    flops / samples: the step's work, for MFU, samples/s and cost (a bad value is
    counted and ignored, never raised).
    """
    if flops is not None or samples is not None:
        process_ledger().note_work(flops, samples)
    return _steps.step()


def step_context(*, flops: float | None = None,
                 samples: float | None = None) -> AbstractContextManager[None]:
    """A context manager that times its block as one step and marks its end.

    `with tpu_tools.agent.step_context(): state = train_step(state, batch)`
    The step time is the block's duration (time between blocks is not counted:
    the goodput ledger gives it to the phase that claims it, else to host work).
    """
    return _step_block(flops, samples)


@contextmanager
def _step_block(flops: float | None, samples: float | None) -> Iterator[None]:
    process_ledger().begin_step()
    start = time.perf_counter()
    yield
    if flops is not None or samples is not None:
        process_ledger().note_work(flops, samples)
    _steps.step(time.perf_counter() - start)


def phase(name: str) -> AbstractContextManager[None]:
    """Give the block's time to the goodput cause `name` ("data", "checkpoint", "eval" or the job's own).

    Compiles inside the block stay compile time. An unacceptable name is
    counted as "other" and reported in the goodput figures, never raised.
    """
    return process_ledger().phase(name)


def step_flops(program: Any) -> float | None:
    """Set the FLOPs of each later step: a compiled program (`jitted.lower(...).compile()`, read from XLA's
    cost analysis over all its devices) or a number. Returns the FLOPs taken, None when unknown (a program XLA
    gives no cost for, or a value that is not a finite number >= 0: counted and reported in the goodput
    figures, never raised)."""
    given = isinstance(program, (int, float)) or job_float(program) is not None
    flops = program if given else program_flops(program)
    # A value that is not a finite number >= 0 is counted and reported in the goodput figures; the FLOPs stay unknown.
    return process_ledger().set_step_flops(flops, "given" if given else "xla_cost_analysis")


def metric(name: str, value: Any, *, scope: str | None = None) -> bool:
    """Publish a scalar of the job (loss, accuracy) to the monitors, at the current step.

    value: a jax.Array of one element, or a number. The agent records whether it
    was replicated on every device of the job, lived on only some of them, or was
    a host number. scope="global" claims it is the same on every worker: the
    agent and the monitors flag it when it is not. Returns whether it was kept
    (a bad name, value or scope is counted and reported, never raised).
    """
    kept = process_metrics().record(name, value, scope, _steps.count)
    _publish_soon()
    return kept


def checkpoint_saved(step: int) -> bool:
    """Say that the job's state after `step` steps is saved, so a process that dies later loses only the steps
    after it (its job's log, docs/goodput.md). Call it once the save is durable. Returns whether it was noted
    (False without a running agent that has a job, or for a step that is not a whole number >= 0; never raises)."""
    writer = _job_writer()
    if writer is None or not _good_step(step):
        return False
    writer.checkpoint_saved(int(step))
    _publish_soon()
    return True


def checkpoint_restored(step: int) -> bool:
    """Say that this process resumed from the state after `step` steps: its later steps are counted from there
    in its job's log, and its predecessor's steps after `step` are the progress the job lost. Returns whether it
    was noted (as `checkpoint_saved`)."""
    writer = _job_writer()
    if writer is None or not _good_step(step):
        return False
    writer.checkpoint_restored(int(step), _steps.count)
    _publish_soon()
    return True


def _good_step(step: Any) -> bool:
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= 1 << 62


def _job_writer() -> Any:
    agent = _agent
    return agent.joblog if agent is not None and agent.pid == os.getpid() else None


def goodput() -> dict[str, Any]:
    """This job's goodput figures now: seconds and % per cause since start and recently, MFU, cost.

    Returns the dict that the agent's snapshot carries under "goodput" (docs/goodput.md); works without
    `start()` (the figures of the steps and phases marked so far).
    """
    agent = _agent
    figures = agent.figures if agent is not None else JobFigures()
    return figures.snapshot()


def _at_step(index: int, step_time_s: float | None) -> None:
    """The agent's part of a step boundary, in one callback: each function the training thread calls here costs
    it some 10 us of CPU with the caches its step left cold. The goodput ledger's step; then, with a running agent,
    a publication when one is due and the job log's last step."""
    try:
        process_ledger().end_step()
    except Exception:  # noqa: BLE001 the ledger never raises into the training loop
        pass
    agent = _agent
    if agent is None:
        return
    if agent.publisher is not None:
        agent.publisher.at_step(index, step_time_s)
    if agent.joblog is not None and agent.pid == os.getpid():
        try:
            agent.joblog.at_step(index + 1)
        except Exception:  # noqa: BLE001 never into the training loop
            pass


def on_step(callback: StepCallback) -> Callable[[], None]:
    """Register `callback(step_index: int, step_time_s: float | None)` for every step boundary.

    Called synchronously, in the thread that marked the step, right after step
    `step_index` ended (so step `step_index + 1` begins when it returns);
    `step_time_s` is None when the step's start is unknown (the first `step()`).
    A profiler starts a trace of steps N..M when called with index N - 1 and
    stops it when called with index M. Returns a function that unregisters it.
    Works without the agent server. A `callback` that is not callable is ignored
    and one that raises is disabled, each reported (a warning on the
    `tpu_tools.agent` logger): neither this nor `step()` raises into the job.
    """
    return _steps.on_step(callback)


def step_count() -> int:
    """How many steps have been marked in this process (by `step()` and `step_context()`); never raises."""
    return _steps.count


# --- the server ------------------------------------------------------------------------------------------

_compiles: Any = None  # one CompileTracker per process: JAX keeps its listeners for good


def _compile_tracker() -> Any:
    global _compiles
    if _compiles is None:
        from tpu_tools.instrument.compiles import CompileTracker

        _compiles = CompileTracker()
    return _compiles


def _user_name() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (containers)
        return str(os.getuid())


class _Agent:
    def __init__(self, tag: str, explain_recompiles: bool, figures: JobFigures):
        import tpu_tools
        from tpu_tools.agent.hardware import HardwareWatch
        from tpu_tools.agent.memory import DeviceMemory
        from tpu_tools.agent.tpusdk import read_sdk_metrics
        from tpu_tools.metrics import wire
        from tpu_tools.metrics.process import SelfSampler

        # What every answer uses, bound once: an import statement on the serving path costs the job about
        # 15 us of CPU each with cold caches, at 10 requests a second.
        self._wire = wire
        self._read_sdk_metrics = read_sdk_metrics
        self._version = tpu_tools.__version__

        self.pid = os.getpid()
        self.tag = tag
        self.explain_recompiles = explain_recompiles
        self.started_unix_s = time.time()
        self.compiles = _compile_tracker()
        self.process = SelfSampler()
        self.device_memory = DeviceMemory()
        self.user = _user_name()
        self._argv: list[str] | None = None
        self._command = sys.executable
        self.jax: ModuleType | None = None
        self.frontends: dict[str, Frontend] = {}  # attached as the job imports them (tpu_tools.agent.frontends)
        self.torch_xla_debug_file: str | None = None  # torch_xla's description of each compile (explain_recompiles)
        self.owns_debug_file = False  # named by the agent: removed when the job ends
        self.before_torch_xla: dict[str, str | None] | None = None  # its settings right before torch_xla ran
        self.attach_error: str | None = None  # why a frontend could not be followed
        self.server: Any = None
        self.publisher: Any = None  # tpu_tools.agent.publish.Publisher, when the snapshot file is on
        self.fault_stacks: Any = None  # tpu_tools.agent.stacks.FaultStacks, when a signal is registered
        self.hardware = HardwareWatch()  # what happened to the hardware, for the job-end record
        self.joblog: Any = None  # tpu_tools.agent.joblog.JobLogWriter, when the process belongs to a named job
        self.figures = figures
        self._full: tuple[dict[str, Any], Frontend | None] | None = None  # the last full snapshot, its frontend

    def attach_jax(self, jax_module: ModuleType) -> None:
        from tpu_tools.agent.goodput import LEDGER_SINK, listen_to_checkpoints, listen_to_programs
        from tpu_tools.agent.publish import PUBLISH_SINK
        from tpu_tools.instrument.cachewatch import watch
        from tpu_tools.instrument.compiles import listener

        self.compiles.install(jax_module, self.explain_recompiles)
        listener().add_sink(LEDGER_SINK)
        listen_to_checkpoints(jax_module)
        listen_to_programs()
        watch().install(jax_module)
        self.jax = jax_module
        self.frontends[JAX] = JaxFrontend(jax_module, self.compiles, self.device_memory, watch)
        listener().add_sink(PUBLISH_SINK)  # each compile published soon, not only at the next step

    def note_before_torch_xla(self) -> None:
        from tpu_tools.agent.xlastartup import environment_now

        self.before_torch_xla = environment_now()

    def attach_torch_xla(self, torch_xla: ModuleType) -> None:
        from tpu_tools.agent.torchxla import TorchXlaFrontend

        try:
            frontend = TorchXlaFrontend(torch_xla, _steps, self.torch_xla_debug_file, self.before_torch_xla)
            frontend.install()
        except Exception as error:  # noqa: BLE001 runs inside the job's `import torch_xla`: never raise into it
            self.attach_error = f"torch_xla not followed: {type(error).__name__}: {error}"
            return
        self.frontends[TORCH_XLA] = frontend

    def answer(self, request: str) -> dict[str, Any]:
        wire = self._wire
        if request == wire.REQUEST_PING:
            return {"schema": wire.SNAPSHOT_SCHEMA, "pid": self.pid, "tag": self.tag}
        if request == wire.REQUEST_ARRAYS:
            return {"schema": wire.SNAPSHOT_SCHEMA, "pid": self.pid, "tag": self.tag, **self.arrays()}
        if request == wire.REQUEST_STACKS:
            from tpu_tools.agent.stacks import thread_stacks

            return {"schema": wire.SNAPSHOT_SCHEMA, "pid": self.pid, "tag": self.tag, "stacks": thread_stacks()}
        return self.snapshot()

    def arrays(self) -> dict[str, Any]:
        """{"arrays_report": the largest live arrays and allocation sites, or None, "arrays_error"}."""
        from tpu_tools.agent.arrays import largest_arrays
        from tpu_tools.agent.memory import backends_ready

        if self.jax is None or not backends_ready(self.jax):
            return {"arrays_report": None, "arrays_error": "the job has not started a JAX backend yet"}
        try:
            return {"arrays_report": largest_arrays(self.jax), "arrays_error": None}
        except Exception as error:  # noqa: BLE001 never into the job: the answer says why
            return {"arrays_report": None, "arrays_error": f"{type(error).__name__}: {error}"}

    def command(self) -> str:
        """The job's command line; `python -m tpu_tools.agent` replaces sys.argv after the agent starts."""
        argv = sys.argv
        if argv is not self._argv:
            self._argv = argv
            self._command = " ".join(argv) if argv and argv[0] else sys.executable
        return self._command

    def snapshot(self) -> dict[str, Any]:
        """The agent's snapshot (`tpu-tools/agent/v1`), every figure read now. It is kept for `step_snapshot`:
        read it, do not change it."""
        frontend = reported(self.frontends)
        shown = FrontendFigures(None, [], self.attach_error, self.compiles.snapshot(), None)
        if frontend is not None:
            try:
                shown = frontend.figures()
            except Exception as error:  # noqa: BLE001 a frontend that fails must not cost the other figures
                shown.memory_error = f"{type(error).__name__}: {error}"
        snapshot = {
            "schema": self._wire.SNAPSHOT_SCHEMA,
            "pid": self.pid,
            "tag": self.tag,
            "user": self.user,
            "command": self.command(),
            "agent_version": self._version,
            "started_unix_s": self.started_unix_s,
            "uptime_s": time.time() - self.started_unix_s,
            "frontend": frontend.name if frontend is not None else None,
            "frontend_version": frontend.version() if frontend is not None else None,
            # a torch_xla job that loaded jax as a helper is not a JAX job
            "jax_version": None if frontend is not None and frontend.name != JAX else getattr(self.jax, "__version__",
                                                                                               None),
            "explain_recompiles": self.explain_recompiles,
            **shown.fields(),
            "process": self.process_figures(),
            "steps": _steps.stats().to_dict(),
            "tpu_sdk": self._read_sdk_metrics(),
            "goodput": self.figures_now(),
            "metrics": process_metrics().snapshot(),
            "stacks_signal": self.fault_stacks.signal if self.fault_stacks is not None else None,
            "job": self.joblog.snapshot() if self.joblog is not None else None,
        }
        self.hardware.sample(snapshot)
        self._full = (snapshot, frontend)
        return snapshot

    def step_snapshot(self) -> dict[str, Any]:
        """The last full snapshot with what the job's steps change read again: its steps, goodput, uptime, the
        process's figures, the job log's step and the frontend's step figures (the devices' memory; torch_xla's
        executions and transfers too); libtpu's SDK reading's age brought to now.
        What the publisher writes between full snapshots (tpu_tools.agent.publish): the rest changes when the job
        compiles, publishes a metric or saves a checkpoint, which asks for a full one. Each function called here
        costs the job some 10 us of CPU with the caches its steps left cold."""
        if self._full is None:
            return self.snapshot()
        last, frontend = self._full
        snapshot = dict(last)
        snapshot["uptime_s"] = time.time() - self.started_unix_s
        snapshot["steps"] = _steps.stats().to_dict()
        snapshot["goodput"] = self.figures_now()
        snapshot["process"] = self.process_figures()
        if self.joblog is not None:
            snapshot["job"] = self.joblog.snapshot()
        if frontend is not None:
            try:
                snapshot.update(frontend.step_figures())
            except Exception as error:  # noqa: BLE001 a frontend that fails must not cost the other figures
                snapshot["memory_error"] = f"{type(error).__name__}: {error}"
        reading = last["tpu_sdk"]
        age = reading.get("read_age_s")
        if isinstance(age, float):  # as old as that at the last full snapshot
            snapshot["tpu_sdk"] = {**reading, "read_age_s": round(age + snapshot["uptime_s"] - last["uptime_s"], 3)}
        return snapshot

    def process_figures(self) -> dict[str, Any]:
        """The process's CPU, memory and threads, read at most every PROCESS_FIGURES_MAX_AGE_S."""
        figures = self.process.sample(max_age_s=PROCESS_FIGURES_MAX_AGE_S)
        return {"cpu_percent": figures.cpu_percent, "cpu_time_s": figures.cpu_time_s, "rss_bytes": figures.rss_bytes,
                "threads": figures.threads}

    def final_snapshot(self) -> dict[str, Any]:
        """The last snapshot, with what happened to the hardware during the job (for its job-end record)."""
        snapshot = self.snapshot()
        return {**snapshot, "hardware": self.hardware.record(snapshot)}

    def figures_now(self) -> dict[str, Any]:
        return self.figures.snapshot(self.jax)

    def info(self) -> AgentInfo:
        return AgentInfo(self.pid, self.tag, self.server.path, self.explain_recompiles)


def start(tag: str | None = None, *, explain_recompiles: bool = False, price_per_hour: float | None = None,
          peak_flops_per_s: float | None = None, job: str | None = None) -> AgentInfo:
    """Start the agent in this process (once; later calls return the running agent's info).

    tag: a name for this job in monitors (default: $TPU_TOOLS_TAG, else the PID).
    explain_recompiles: turn on `jax_explain_cache_misses` so each recompilation
    carries JAX's reason (the explanations are kept off the job's log unless the
    job turned them on itself); for torch_xla, imported later, its description
    of each compile (PT_XLA_DEBUG_LEVEL=1 into a file of the agent's directory).
    price_per_hour, peak_flops_per_s: for the cost per 1M samples and MFU (else
    $TPU_TOOLS_PRICE_PER_HOUR, and $TPU_TOOLS_PEAK_FLOPS or the device table);
    a value that is not a finite number > 0 leaves the figure unknown.
    job: the job this process is one process of, across restarts and hosts (default: $TPU_TOOLS_JOB, else the
    Kubernetes JobSet or Job, else the Slurm job): its events go to the job's log (docs/goodput.md).
    Raises AgentError when the socket cannot be created.
    """
    global _agent
    with _lock:
        if _agent is not None and _agent.pid == os.getpid():
            return _agent.info()
        from tpu_tools.agent.server import AgentServer
        from tpu_tools.instrument.jaxhook import call_when_imported
        from tpu_tools.metrics.rundir import RunDirError, socket_path

        chosen = job_name(tag) or os.environ.get(ENV_TAG) or str(os.getpid())  # a tag that is not text: the default
        agent = _Agent(chosen, job_flag(explain_recompiles), JobFigures(price_per_hour, peak_flops_per_s))
        try:
            agent.server = AgentServer(socket_path(agent.pid), agent.answer)
            agent.server.start()
        except (RunDirError, OSError) as error:
            raise AgentError(f"the tpu-tools agent could not start: {error}") from error
        _register_fault_stacks(agent)
        _start_job_log(agent, job)
        _start_publishing(agent)
        _agent = agent
        if explain_recompiles:
            from tpu_tools.agent.torchxla import prepare_explain

            agent.torch_xla_debug_file, agent.owns_debug_file = prepare_explain(agent.server.path.parent)
    call_when_imported(agent.attach_jax)
    call_when_imported(agent.attach_torch_xla, TORCH_XLA, before=agent.note_before_torch_xla)
    return agent.info()


def _start_publishing(agent: _Agent) -> None:
    """The snapshot file monitors read (tpu_tools.agent.publish); without it they ask the socket."""
    from tpu_tools.agent.publish import Publisher, publishing_wanted

    if not publishing_wanted():
        return
    publisher = Publisher(agent.server.path, agent.snapshot, agent.step_snapshot)
    try:
        publisher.start()
    except OSError:  # an unusable file costs the monitors the shortcut, never the job its agent
        publisher.stop()
        return
    agent.publisher = publisher


def _start_job_log(agent: _Agent, given: str | None) -> None:
    """The job's log (tpu_tools.agent.joblog), when the process belongs to a job it can name."""
    from tpu_tools.agent.joblog import JobLogWriter
    from tpu_tools.metrics.joblog import job_identity

    try:
        identity = job_identity(given=given if isinstance(given, str) else None)
        if identity is None:
            return
        writer = JobLogWriter(identity, process_ledger().start_unix_s, _ledger_causes)
        writer.start()
    except Exception:  # noqa: BLE001 a job that cannot be logged still runs, and still has its agent
        return
    agent.joblog = writer


def _ledger_causes() -> dict[str, float]:
    causes: dict[str, float] = process_ledger().snapshot()["since_start"]["causes_s"]
    return causes


def _register_fault_stacks(agent: _Agent) -> None:
    """faulthandler on a signal, for the stacks of a job stuck holding its interpreter's lock (agent/stacks.py)."""
    from tpu_tools.agent.stacks import FaultStacks

    fault_stacks = FaultStacks(agent.server.path.with_suffix(".stacks"))
    try:
        fault_stacks.start()
    except (OSError, ValueError, RuntimeError):  # the job goes on without it; its snapshot names no signal
        return
    agent.fault_stacks = fault_stacks


def _publish_soon() -> None:
    """Ask the running agent's publisher for a publication soon (a change outside a step); never raises."""
    agent = _agent
    if agent is not None and agent.publisher is not None:
        agent.publisher.request()


def stop() -> None:
    """Leave the job's summary in the runtime directory, stop serving and remove the socket (also done at exit).

    Returns nothing; without a running agent it does nothing. A summary that cannot be written is reported on
    the `tpu_tools.agent` logger, never raised into the job.
    """
    global _agent
    with _lock:
        agent, _agent = _agent, None
    if agent is not None and agent.pid == os.getpid():
        if agent.joblog is not None:
            agent.joblog.stop()
        write_job_summary(agent.final_snapshot)
        if agent.owns_debug_file and agent.torch_xla_debug_file is not None:
            from tpu_tools.agent.torchxla import remove_explain_file

            remove_explain_file(agent.torch_xla_debug_file)
    if agent is not None and agent.publisher is not None:
        agent.publisher.stop()
    if agent is not None and agent.fault_stacks is not None:
        agent.fault_stacks.stop()
    if agent is not None and agent.server is not None:
        agent.server.stop()


def current() -> AgentInfo | None:
    """The running agent of this process (its `AgentInfo`), or None: none started, or it was started in the parent
    of this forked process. Never raises."""
    agent = _agent
    return agent.info() if agent is not None and agent.pid == os.getpid() else None


def _after_fork_in_child() -> None:
    global _agent
    reset_after_fork()
    reset_metrics_after_fork()
    agent, _agent = _agent, None
    if agent is not None:
        agent.process.close()  # the parent's stat file
        if agent.server is not None:
            agent.server.forget_after_fork()
        if agent.publisher is not None:
            agent.publisher.forget_after_fork()
        if agent.fault_stacks is not None:
            agent.fault_stacks.forget_after_fork()
        if agent.joblog is not None:
            agent.joblog.forget_after_fork()


def _at_exit() -> None:
    agent = _agent
    if agent is not None and agent.pid == os.getpid():
        stop()


_steps.on_step(_at_step)
os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
