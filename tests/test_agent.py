"""The workload agent in real child processes running real JAX programs on the CPU platform."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time

import psutil
import pytest
from agentjobs import rundir, running_job, start_job, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import clean_env

from tpu_tools.metrics import agent_client, wire
from tpu_tools.metrics.rundir import RunDirError


@pytest.fixture(scope="module")
def jax_job():
    """One real JAX job with the agent (2 CPU devices, recompile explanations on), shared by this module."""
    with running_job(tag="trainer", explain=True, host_devices=2) as started:
        yield started


def test_snapshot_of_a_real_jax_job(jax_job):
    job, path = jax_job

    def walked() -> dict | None:  # the live arrays are counted again at most once a second (docs/agent.md)
        found = agent_client.query_agent(job.pid, directory=path)
        return found if all(d["live_array_count"] for d in found["devices"]) else None

    snapshot = wait_for(walked, timeout=30)
    assert snapshot["schema"] == "tpu-tools/agent/v1"
    assert snapshot["pid"] == job.pid
    assert snapshot["tag"] == "trainer"
    assert snapshot["runtime"]["platform"] == "cpu"
    assert 0 <= snapshot["runtime"]["live_arrays_age_s"] < 60  # a job this small is walked at every request
    devices = snapshot["devices"]
    assert [d["id"] for d in devices] == [0, 1]
    # The sharded (512, 1024) f32 array puts 1 MiB on each device.
    for device in devices:
        assert device["live_array_bytes"] >= 256 * 1024 * 4
        assert device["live_array_count"] >= 1
        assert device["memory_used_bytes"] is None  # the CPU platform reports no memory statistics
    process = snapshot["process"]
    assert process["rss_bytes"] > 50 << 20
    assert process["threads"] >= 2
    assert process["cpu_percent"] >= 0
    # The agent reads its own figures cheaply; they agree with what psutil sees from outside.
    outside = psutil.Process(job.pid)
    with outside.oneshot():
        rss, threads, cpu = outside.memory_info().rss, outside.num_threads(), sum(outside.cpu_times()[:2])
    assert abs(process["rss_bytes"] - rss) < 0.2 * rss
    assert abs(process["threads"] - threads) <= 2
    assert 0 < process["cpu_time_s"] <= cpu + 0.05
    # Launched as `python -m tpu_tools.agent ... job.py`: the job's own command line, not the launcher's.
    assert snapshot["command"].split()[0].endswith("job.py")
    assert "tpu_tools.agent" not in snapshot["command"]
    assert snapshot["user"] == pwd.getpwuid(os.getuid()).pw_name


def test_compiles_and_the_recompile_reason(jax_job):
    job, path = jax_job
    compiles = agent_client.query_agent(job.pid, directory=path)["compiles"]
    functions = {f["name"]: f for f in compiles["functions"]}
    step_fn = functions["train_step"]
    assert step_fn["compile_count"] == 2
    assert step_fn["recompile_count"] == 1
    assert step_fn["trace_time_s"] > 0
    assert step_fn["lowering_time_s"] > 0
    assert step_fn["backend_compile_time_s"] > 0
    assert "f32[16,64]" in step_fn["last_recompile_reason"]
    assert "f32[8,64]" in step_fn["last_recompile_reason"]
    recent = [r for r in compiles["recent_recompiles"] if r["function"] == "train_step"]
    assert len(recent) == 1
    assert "different input types" in recent[0]["reason"]
    assert compiles["compile_count"] >= 2
    assert compiles["recompile_count"] >= 1


def test_steps_are_counted_and_timed(jax_job):
    job, path = jax_job
    first = agent_client.query_agent(job.pid, directory=path)["steps"]

    def more_steps() -> dict | None:
        steps = agent_client.query_agent(job.pid, directory=path)["steps"]
        return steps if steps["count"] > first["count"] else None

    second = wait_for(more_steps)
    assert second["count"] > first["count"] >= 20
    assert second["steps_per_second"] > 0  # the figures of a running job: present, positive and ordered
    assert 0 < second["p50_step_time_s"] <= second["p99_step_time_s"]


def test_list_agents_and_private_files(jax_job):
    job, path = jax_job
    records = agent_client.list_agents(directory=path)
    assert [(r.pid, r.tag) for r in records] == [(job.pid, "trainer")]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    info = os.stat(records[0].socket_path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert records[0].socket_path.name == f"agent-{job.pid}.sock"


def _raw_exchange(path, payload: bytes, timeout: float = 5.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        if payload:
            sock.sendall(payload)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return received
            received += chunk


@pytest.mark.parametrize("payload", [
    b"not json\n",
    b"[1, 2, 3]\n",
    b'{"request": "__import__(\'os\').system(\'touch /tmp/tt-pwned\')"}\n',
    b"x" * (wire.MAX_REQUEST_BYTES + 10),
    b"\xff\xfe\n",
], ids=["not-json", "not-object", "unknown-request", "oversized", "not-utf8"])
def test_malformed_requests_close_the_connection_and_nothing_else(jax_job, payload):
    job, path = jax_job
    socket_path = path / f"agent-{job.pid}.sock"
    assert _raw_exchange(socket_path, payload) == b""
    assert not os.path.exists("/tmp/tt-pwned")
    assert agent_client.query_agent(job.pid, directory=path)["tag"] == "trainer"  # still serving


def test_a_silent_client_is_dropped_and_does_not_block_others(jax_job):
    job, path = jax_job
    socket_path = path / f"agent-{job.pid}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(socket_path))
        started = time.monotonic()
        assert agent_client.query_agent(job.pid, directory=path)["pid"] == job.pid  # served meanwhile
        silent.setblocking(False)  # still connected when the answer came: the silent client held nothing up
        with pytest.raises(BlockingIOError):
            silent.recv(10)
        silent.setblocking(True)
        silent.settimeout(wire.REQUEST_TIMEOUT_S + 3)
        assert silent.recv(10) == b""  # the agent closed it after its request timeout
        assert time.monotonic() - started >= wire.REQUEST_TIMEOUT_S - 0.5


def test_a_client_of_another_user_is_refused(rundir):
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    nobody = pwd.getpwnam("nobody")
    job = start_job(rundir, tag="private", light=True, launcher=False).wait_ready()
    try:
        socket_path = rundir / f"agent-{job.pid}.sock"
        # Open the directory and socket up so that only the peer-credential check stands in the way.
        os.chmod(rundir, 0o755)
        os.chmod(socket_path, 0o666)
        client = ("import socket, sys\n"
                  "s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])\n"
                  "data = b''\n"
                  "try:\n"
                  "    s.sendall(b'{\"request\": \"snapshot\"}\\n')\n"
                  "    while chunk := s.recv(65536): data += chunk\n"
                  "except (ConnectionResetError, BrokenPipeError):  # refused before or after the request\n"
                  "    pass\n"
                  "print(len(data))\n")
        result = subprocess.run(["/usr/bin/env", "python3", "-c", client, str(socket_path)], user=nobody.pw_uid,
                                group=nobody.pw_gid, capture_output=True, text=True, timeout=30, cwd="/")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "0"  # connection closed without a byte of the snapshot
        os.chmod(rundir, 0o700)
        os.chmod(socket_path, 0o600)
        assert agent_client.query_agent(job.pid, directory=rundir)["tag"] == "private"
    finally:
        job.stop()


def test_socket_removed_at_exit_and_stale_entries_cleaned(rundir):
    clean = start_job(rundir, tag="clean", light=True, launcher=False, lifetime_s=1.0).wait_ready()
    killed = start_job(rundir, tag="killed", light=True, launcher=False).wait_ready()
    try:
        clean.process.wait(timeout=30)
        assert not (rundir / f"agent-{clean.pid}.sock").exists()  # removed by the agent at exit
        killed.process.send_signal(signal.SIGKILL)
        killed.process.wait(timeout=10)
        stale = rundir / f"agent-{killed.pid}.sock"
        assert stale.exists()  # SIGKILL leaves it behind
        scan = agent_client.query_agents(directory=rundir)
        assert scan.results == []
        assert killed.pid in scan.removed_stale
        assert not stale.exists()
        with pytest.raises(agent_client.AgentGone, match="^no agent is registered for process "):
            agent_client.query_agent(killed.pid, directory=rundir)
    finally:
        clean.stop()
        killed.stop()


def test_tag_from_environment_and_pid_default(rundir):
    tagged = start_job(rundir, light=True, launcher=False, extra_env={"TPU_TOOLS_TAG": "from-env"})
    untagged = start_job(rundir, light=True, launcher=False)
    try:
        tagged.wait_ready()
        untagged.wait_ready()
        tags = {r.pid: r.tag for r in agent_client.list_agents(directory=rundir)}
        assert tags == {tagged.pid: "from-env", untagged.pid: str(untagged.pid)}
    finally:
        tagged.stop()
        untagged.stop()


def test_agent_leaves_jax_import_to_the_script(rundir, tmp_path):
    # The script configures jax through os.environ before importing it: the agent must not have imported
    # jax first, or the 3 devices asked for would not be there.
    script = tmp_path / "late.py"
    script.write_text(
        "import importlib.util, os, sys, time\n"
        "assert 'jax' not in sys.modules, 'the agent imported jax'\n"
        "assert importlib.util.find_spec('jax') is not None  # a probe, as libraries do, imports nothing\n"
        "assert 'jax' not in sys.modules\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'\n"
        "import jax, jax.numpy as jnp\n"
        "jax.jit(lambda v: v * 2)(jnp.ones(3)).block_until_ready()\n"
        "open(sys.argv[1], 'w').write('ok')\n"
        "time.sleep(30)\n")
    ready = tmp_path / "ready"
    process = subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", str(script), str(ready)],
                               env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), JAX_PLATFORMS="cpu"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: ready.exists() or process.poll() is not None, timeout=60)
        assert process.poll() is None, process.stdout.read()
        snapshot = agent_client.query_agent(process.pid, directory=rundir)
        assert len(snapshot["devices"]) == 3
        assert snapshot["compiles"]["listening"]
        assert snapshot["compiles"]["compile_count"] >= 1
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()


def test_run_module_with_arguments_and_exit_status(rundir, tmp_path):
    (tmp_path / "mymod.py").write_text(
        "import sys, tpu_tools.agent as agent\n"
        "info = agent.current()\n"
        "print('argv', sys.argv[1:], 'tag', info.tag, 'name', __name__)\n"
        "sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", "--tag", "mod", "-m", "mymod", "a", "--b"],
                            env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir)), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "argv ['a', '--b'] tag mod name __main__" in result.stdout
    assert os.listdir(rundir) == ["jobs-ended"]  # socket removed at exit, the job's summary left
    assert len(os.listdir(rundir / "jobs-ended")) == 1


def test_script_exception_is_reported_like_python(rundir, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('boom')\n")
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(script)],
                            env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert "ValueError: boom" in result.stderr
    assert "Traceback" in result.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    ([], "no script or -m module given"),
    (["--tag"], "--tag needs a value"),
    (["--frobnicate", "x.py"], "unknown option --frobnicate"),
    (["/nonexistent/script.py"], "can't open file"),
    (["-m", "no_such_module_anywhere"], "no module named"),
    (["--tag", " ", "x.py"], "--tag must not be empty"),
    (["--price-per-hour", "0", "x.py"], "--price-per-hour must be a finite number > 0, got '0'"),
    (["--price-per-hour=inf", "x.py"], "--price-per-hour must be a finite number > 0, got 'inf'"),
    (["--price-per-hour"], "--price-per-hour needs a value"),
])
def test_launcher_usage_errors(rundir, args, fragment):
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", *args],
                            env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert fragment in result.stderr.splitlines()[0]


def test_an_unsafe_runtime_directory_is_refused(tmp_path):
    unsafe = tmp_path / "rd"
    unsafe.mkdir(mode=0o755)
    os.chmod(unsafe, 0o755)
    script = tmp_path / "ok.py"
    script.write_text("print('job ran')\n")
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(script)],
                            env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(unsafe)), capture_output=True, text=True,
                            timeout=60)
    # The job runs anyway, with one warning; nothing is created in the unsafe directory.
    assert result.returncode == 0
    assert "job ran" in result.stdout
    assert "warning" in result.stderr
    assert "0755" in result.stderr
    assert os.listdir(unsafe) == []
    with pytest.raises(RunDirError, match="has mode 0755, not 0700; not using it"):
        agent_client.query_agents(directory=unsafe)


def test_steps_and_callbacks_without_the_server():
    # In a fresh interpreter: step(), step_context() and on_step() work without start().
    code = (
        "import json, time, tpu_tools.agent as agent\n"
        "calls = []\n"
        "remove = agent.on_step(lambda i, t: calls.append((i, t)))\n"
        "agent.step(); time.sleep(0.01); agent.step()\n"
        "with agent.step_context():\n"
        "    time.sleep(0.02)\n"
        "remove(); agent.step()\n"
        "print(json.dumps({'calls': calls, 'count': agent.step_count(), 'running': agent.current() is not None,\n"
        "                  'jax_imported': 'jax' in __import__('sys').modules}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=clean_env())
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    calls = document["calls"]
    assert [c[0] for c in calls] == [0, 1, 2]
    assert calls[0][1] is None
    assert 0.005 < calls[1][1] < 1
    assert 0.015 < calls[2][1] < 1
    assert document["count"] == 4
    assert not document["running"]
    assert not document["jax_imported"]


def test_persistent_cache_misses_then_hits(rundir, tmp_path):
    # Two runs of one program with JAX's persistent compilation cache: the first writes (misses), the second
    # loads the executable (hits); both are credited to the function that was compiled.
    script = tmp_path / "cached.py"
    script.write_text(
        "import sys, time, jax, jax.numpy as jnp\n"
        "jax.jit(lambda v: jnp.sin(v) * 3)(jnp.ones(7)).block_until_ready()\n"
        "open(sys.argv[1], 'w').write('ok')\n"
        "time.sleep(30)\n")
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), JAX_PLATFORMS="cpu",
                    JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    seen = []
    for run in range(2):
        ready = tmp_path / f"ready{run}"
        process = subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", str(script), str(ready)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda ready=ready, process=process: ready.exists() or process.poll() is not None, timeout=60)
            assert process.poll() is None
            functions = agent_client.query_agent(process.pid, directory=rundir)["compiles"]["functions"]
            seen.append(next(f for f in functions if f["name"] == "<lambda>"))
        finally:
            process.kill()
            process.wait(timeout=10)
    assert seen[0]["cache_misses"] == 1
    assert seen[0]["cache_hits"] == 0
    assert seen[1]["cache_hits"] == 1
    assert seen[1]["cache_misses"] == 0
