"""Real workloads running the agent, for the agent, monitor and top tests.

Every job is a real child process with a time limit of its own (it exits after
`lifetime_s` even if a test forgets it) and is killed by `stop()`; fixtures
make sure `stop()` runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import clean_env

# A small JAX training-like loop: one function compiled for two shapes (one recompilation with a
# reason), a sharded array on every device, steps marked with the context manager.
JAX_JOB = textwrap.dedent("""
    import os, sys, time
    ready, lifetime = sys.argv[1], float(sys.argv[2])
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent

    @jax.jit
    def train_step(w, x):
        return w - 0.001 * (x.T @ (x @ w)) / x.shape[0]

    n = len(jax.devices())
    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    big = jax.device_put(jnp.ones((n * 256, 1024), jnp.float32),
                         jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    w = jnp.ones((64, 64))
    train_step(w, jnp.ones((8, 64))).block_until_ready()
    train_step(w, jnp.ones((16, 64))).block_until_ready()  # a recompilation: new input shape
    x = jnp.ones((16, 64))
    deadline = time.time() + lifetime
    marked = 0
    while time.time() < deadline:
        with agent.step_context():
            w = train_step(w, x).block_until_ready()
        marked += 1
        if marked == 20:
            open(ready, "w").write(str(os.getpid()))
        time.sleep(0.02)
""")

# An agent without jax: starts in a fraction of the time, for tests that need many processes.
LIGHT_JOB = textwrap.dedent("""
    import os, sys, time
    ready, lifetime = sys.argv[1], float(sys.argv[2])
    import tpu_tools.agent as agent
    agent.start(tag=sys.argv[3] if len(sys.argv) > 3 else None)
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + lifetime
    while time.time() < deadline:
        agent.step()
        time.sleep(0.05)
""")


def make_rundir() -> Path:
    """A private runtime directory with a short path (Unix socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="tt", dir="/tmp"))


class Job:
    def __init__(self, process: subprocess.Popen, ready: Path, workdir: Path):
        self.process = process
        self.ready = ready
        self.workdir = workdir

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 60.0) -> Job:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.exists() and self.ready.read_text():
                return self
            if self.process.poll() is not None:
                output = self.process.stdout.read() if self.process.stdout else ""
                raise AssertionError(f"job exited with {self.process.returncode}: {output}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError("job did not become ready in time")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        # SIGTERM first: a job measured by coverage saves its data on SIGTERM, never on SIGKILL.
        if self.process.poll() is None:
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_job(rundir: Path, *, tag: str | None = None, explain: bool = False, host_devices: int | None = None,
              light: bool = False, lifetime_s: float = 90.0, launcher: bool = True,
              extra_env: dict[str, str | None] | None = None, extra_args: tuple[str, ...] = ()) -> Job:
    """Start a workload with the agent. `launcher`: through `python -m tpu_tools.agent` (else the
    light job calls `tpu_tools.agent.start()` itself). `extra_args` end the job's command line (the
    job ignores them)."""
    workdir = Path(tempfile.mkdtemp(prefix="job", dir="/tmp"))
    script = workdir / "job.py"
    script.write_text(LIGHT_JOB if light else JAX_JOB)
    ready = workdir / "ready"
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), JAX_PLATFORMS="cpu", **(extra_env or {}))
    if host_devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={host_devices}"
    args = [str(ready), str(lifetime_s)]
    if light:
        command = [sys.executable, str(script), *args, *([tag] if tag else [])]
    else:
        options = [*(["--tag", tag] if tag else []), *(["--explain-recompiles"] if explain else [])]
        command = [sys.executable, "-m", "tpu_tools.agent", *options, str(script), *args, *extra_args]
    assert launcher or light
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
    return Job(process, ready, workdir)


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1):
    """Poll until predicate() is truthy; returns its value or raises after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def published_after(rundir: Path, since_unix_s: float, agents: int) -> bool:
    """Whether `agents` agents of `rundir` have each published a snapshot after `since_unix_s`: a job that marks
    no step publishes every second, so a monitor that reads before then may read one from before."""
    from tpu_tools.metrics.agent_client import query_agents

    scan = query_agents(2.0, directory=rundir)
    times = [r.snapshot.published_unix_s for r in scan.results if r.snapshot is not None]
    return len(times) >= agents and all(t is not None and t > since_unix_s for t in times)


def agent_env(rundir: Path, **extra: str) -> dict[str, str]:
    return clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), **extra)


def remove_rundir(rundir: Path) -> None:
    shutil.rmtree(rundir, ignore_errors=True)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@contextmanager
def running_job(**options) -> Iterator[tuple[Job, Path]]:
    """A ready job with the agent in a runtime directory of its own; both gone afterwards."""
    path = make_rundir()
    job = start_job(path, **options)
    try:
        yield job.wait_ready(), path
    finally:
        job.stop()
        remove_rundir(path)


@pytest.fixture
def rundir() -> Iterator[Path]:
    """An empty private runtime directory (import this fixture into a test module to use it)."""
    path = make_rundir()
    yield path
    remove_rundir(path)
