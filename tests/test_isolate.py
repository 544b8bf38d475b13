"""The isolated runtime child on the real CPU PJRT runtime, and its failure modes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from agentjobs import wait_for

from tpu_tools.errors import PlatformUnavailable, RuntimeCrash, RuntimeFailure, RuntimeHang
from tpu_tools.pjrt import isolate, queries
from tpu_tools.pjrt.devices import RuntimeRecord
from tpu_tools.pjrt.runtime import RuntimePolicy


def _policy(**kwargs) -> RuntimePolicy:
    return RuntimePolicy(platform="cpu", **kwargs)


def test_lists_the_cpu_devices_of_a_real_runtime():
    answer = isolate.run_isolated(queries.LIST_DEVICES, {}, _policy(host_devices=4))
    runtime = RuntimeRecord.from_dict(answer["runtime"])
    assert runtime.platform == "cpu"
    assert [d.id for d in runtime.devices] == [0, 1, 2, 3]
    assert runtime.process_count == 1
    assert runtime.local_device_count == 4
    assert all(d.device_kind == "cpu" and d.process_index == 0 for d in runtime.devices)


def test_probe_runs_compiles_and_verifies_on_every_device():
    answer = isolate.run_isolated(queries.LIST_DEVICES, {"probe": True}, _policy(host_devices=2))
    probes = answer["probe"]
    assert [p["device_id"] for p in probes] == [0, 1]
    assert all(p["ok"] and p["compile_ms"] > 0 and p["execute_us"] > 0 for p in probes)


def _assert_gone(pid: int) -> None:
    for _ in range(50):
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} was left behind")


def test_a_hanging_runtime_is_killed_at_the_timeout(monkeypatch, hanging_plugin):
    monkeypatch.setenv("PYTHONPATH", str(hanging_plugin))
    call = isolate.start_isolated(queries.LIST_DEVICES, {}, _policy(), timeout_s=2)
    with pytest.raises(RuntimeHang, match="the cpu runtime did not answer within 2 s"):  # the runtime never answers
        call.result()
    _assert_gone(call.process.pid)


def test_a_crashing_runtime_reports_its_signal(monkeypatch, crashing_plugin):
    monkeypatch.setenv("PYTHONPATH", str(crashing_plugin))
    with pytest.raises(RuntimeCrash, match="crashed with SIGSEGV"):
        isolate.run_isolated(queries.LIST_DEVICES, {}, _policy(), timeout_s=20)


def test_an_exception_in_the_query_is_a_runtime_failure():
    with pytest.raises(RuntimeFailure, match="JSONDecodeError"):
        isolate.run_isolated("json:loads", {"s": "{"}, _policy())


def test_a_platform_jax_cannot_load_is_platform_unavailable(monkeypatch):
    # jax's own error path, reached by bypassing our pre-check with an unknown plugin platform name.
    monkeypatch.setattr(isolate, "check_platform_installed", lambda policy: None)
    with pytest.raises(PlatformUnavailable, match="rocm platform is not available"):
        isolate.run_isolated(queries.LIST_DEVICES, {}, RuntimePolicy(platform="rocm"))


def test_the_child_dies_with_its_parent(tmp_path, hanging_plugin):
    """A parent killed with SIGKILL cannot clean up; the child must not outlive it."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from tpu_tools.pjrt import isolate, queries\n"
        "from tpu_tools.pjrt.runtime import RuntimePolicy\n"
        "call = isolate.start_isolated(queries.LIST_DEVICES, {}, RuntimePolicy(platform='cpu'), 600)\n"
        "print(call.process.pid, flush=True)\n"
        "time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(hanging_plugin))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    child_pid = int(parent.stdout.readline())
    wait_for(lambda: "jaxlib" in Path(f"/proc/{child_pid}/maps").read_text(), timeout=60)  # into the runtime start
    assert psutil.pid_exists(child_pid)
    parent.kill()
    parent.wait()
    _assert_gone(child_pid)
