"""Who holds a device: on a GPU, the processes its driver lists (NVML's compute and graphics processes, as
nvidia-ml-py reads them), not whoever opened /dev/nvidia* to ask NVML; device-node scanning only where the driver's
list is not there, and then the report says so. The toolkit's own observing programs are never holders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sysroot
from conftest import run_tool
from fakenvml import nvml_env

TESTS = Path(__file__).resolve().parent
JOB = 1332
# The observers of a real H100 host: an exporter and a tpu-top, each with the GPU's node open for NVML. The
# fixture's minor numbers run against PCI order: gpu:0 (NVML's GPU 0) is /dev/nvidia1.
OBSERVERS = [
    (1335, ["python3", "/usr/local/bin/tpu-monitor", "--prometheus", ":9400"], ["/dev/nvidia1", "/dev/nvidiactl"]),
    (1336, ["/usr/bin/python3.12", "-m", "tpu_tools", "top"], ["/dev/nvidia0", "/dev/nvidiactl"]),
    (1337, ["tpu-tools", "ls", "--json"], ["/dev/nvidia1"]),
]


@pytest.fixture
def h100_host(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    host = sysroot.nvidia_host(root)
    host.process(sysroot.FakeProcess(JOB, 1000, ["gputrain", "--steps", "100"], ["/dev/nvidia1", "/dev/nvidiactl"]))
    for pid, command, nodes in OBSERVERS:
        host.process(sysroot.FakeProcess(pid, 1000, command, nodes))
    return root


def _holders(report: dict) -> dict[str, tuple[list[int], str]]:
    return {d["key"]: ([h["pid"] for h in d["holders"]], d["holders_source"]) for d in report["devices"]["devices"]}


def _nvidia_ml_py_pids(env: dict[str, str]) -> list[list[int]]:
    """Each GPU's compute and graphics processes as nvidia-ml-py reads them from the same library."""
    code = ("import json, pynvml\npynvml.nvmlInit()\nout = []\n"
            "for i in range(pynvml.nvmlDeviceGetCount()):\n"
            "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
            "    out.append(sorted({p.pid for p in [*pynvml.nvmlDeviceGetComputeRunningProcesses(h),"
            " *pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)]}))\n"
            "print(json.dumps(out))")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_gpu_holders_are_nvml_processes_as_nvidia_ml_py_lists_them(fake_nvml_dir, h100_host, tmp_path):
    # a run directory of its own: no agent job of another test on the host
    env = nvml_env(fake_nvml_dir, h100_host, FAKE_NVML_PROCS=f"0:{JOB}:12190000000",
                   TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"))
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert _holders(report) == {"gpu:0": ([JOB], "nvml"), "gpu:1": ([], "nvml")}
    assert _nvidia_ml_py_pids(env) == [[JOB], []]
    assert [h["pid"] for h in report["processes"]["holders"]] == [JOB]
    exposition = subprocess.run([sys.executable, str(TESTS / "exposition_once.py")], env=env, capture_output=True,
                                text=True, timeout=120)
    assert exposition.returncode == 0, exposition.stderr
    held = [line for line in exposition.stdout.splitlines() if line.startswith("tpu_tools_device_holder_processes{")]
    assert len(held) == 2
    assert all('holders_source="nvml"' in line for line in held)
    assert {line.split('device="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in held} == {
        "gpu:0": 1.0, "gpu:1": 0.0}


def test_without_nvml_the_device_nodes_name_the_holders_and_say_so(h100_host, tmp_path):
    env = nvml_env(h100_host / "nowhere", h100_host, TPU_TOOLS_NVML="0", TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"))
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert _holders(report) == {"gpu:0": ([JOB], "device_nodes"), "gpu:1": ([], "device_nodes")}
    assert [h["pid"] for h in report["processes"]["holders"]] == [JOB]


def test_observers_never_hold_a_tpu(tmp_path):
    root = tmp_path / "root"
    host = sysroot.v4_host(root, holders={4242: [0]})
    host.process(sysroot.FakeProcess(4300, 1000, ["python3", "/usr/bin/tpu-monitor", "--prometheus", ":9400"],
                                     ["/dev/accel1"]))
    host.process(sysroot.FakeProcess(4301, 1000, ["python3", "-m", "tpu_tools.cli.top"], ["/dev/accel2"]))
    host.process(sysroot.FakeProcess(4302, 1000, ["/opt/venv/bin/tpu-dump", "-o", "x.tar.gz"], ["/dev/accel3"]))
    env = nvml_env(root / "nowhere", root, TPU_TOOLS_NVML="0", TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"))
    listed = run_tool("tpu-ls", "--json", "--no-runtime", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    chips = json.loads(listed.stdout)["chips"]
    assert [[h["pid"] for h in chip["holders"]] for chip in chips] == [[4242], [], [], []]
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    report = json.loads(result.stdout)
    assert {key: pids for key, (pids, source) in _holders(report).items() if pids} == {"tpu:0": [4242]}
    assert {source for _, source in _holders(report).values()} == {"device_nodes"}
