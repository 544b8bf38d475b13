"""Pod labels: /proc/PID/cgroup fixtures and an in-process kubelet pod-resources server."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import msgspec
import pytest
import sysroot
from agentjobs import agent_env, running_job
from conftest import run_tool
from hypothesis import given
from hypothesis import strategies as st
from podresources_server import PodResourcesServer, pod

from tpu_tools.errors import RuntimeFailure
from tpu_tools.exporter.prometheus import process_metrics
from tpu_tools.metrics.kube.cgroup import PodRef, parse_cgroup
from tpu_tools.metrics.kube.podresources import ContainerRef, PodResourcesClient
from tpu_tools.metrics.records.jobs import AgentEntry, ProcessesGroup

UID = "6f2c1e4a-93b1-4c1e-8d3a-2b7e0f9c1d55"
CID = "0123456789abcdef" * 4
SYSTEMD = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
           f"cri-containerd-{CID}.scope\n")
CGROUPFS_V1 = (f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
               "1:name=systemd:/\n")


@pytest.mark.parametrize("text", [SYSTEMD, CGROUPFS_V1, f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
                                  f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"],
                         ids=["systemd-v2", "cgroupfs-v1", "cgroupfs-v2", "crio-guaranteed"])
def test_cgroup_names_the_pod_and_container(text):
    assert parse_cgroup(text) == PodRef(UID, CID)


def test_processes_outside_kubernetes_have_no_pod():
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_cgroup("0::/\n") is None
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n") == PodRef(UID, None)


@given(st.text(max_size=400))
def test_any_cgroup_text_parses_or_is_none(text):
    found = parse_cgroup(text)
    assert found is None or (len(found.pod_uid) == 36 and (found.container_id is None or len(found.container_id) == 64))


def _sock(tmp_path):
    return Path(tempfile.mkdtemp(prefix="pr", dir="/tmp")) / "kubelet.sock"  # short: socket paths are limited


def test_client_reads_device_owners_and_fails_clearly(tmp_path):
    path = _sock(tmp_path)
    client = PodResourcesClient(path, 0.5)
    with pytest.raises(RuntimeFailure, match="no kubelet pod-resources socket at"):
        client.device_owners()
    with PodResourcesServer(path, [pod("ml", "train-0", "trainer", "google.com/tpu", ["0", "1"])]) as server:
        owners = client.device_owners()
        assert owners == {("google.com/tpu", "0"): ContainerRef("ml", "train-0", "trainer"),
                          ("google.com/tpu", "1"): ContainerRef("ml", "train-0", "trainer")}
        server.lister.hanging.set()
        with pytest.raises(RuntimeFailure, match="did not answer within 0.5 s"):  # it hangs until the server stops
            client.device_owners()
    client.close()


def _host(tmp_path, agent_pid: int):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={agent_pid: [0, 1, 2, 3], 4001: [4, 5, 6, 7]})
    (root / "proc" / str(agent_pid) / "cgroup").write_text(SYSTEMD)
    (root / "proc" / "4001" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID[:-1]}6/{'f' * 64}\n")
    return root


def test_monitor_labels_agents_and_holders_with_their_pods(tmp_path):
    path = _sock(tmp_path)
    pods = [pod("ml", "train-0", "trainer", "google.com/tpu", ["0", "1", "2", "3"]),
            pod("ml", "eval-0", "evaluator", "google.com/tpu", ["4", "5", "6", "7"]),
            pod("other", "gpu-job", "main", "nvidia.com/gpu", ["0"])]
    with running_job(light=True, tag="train") as (job, rundir), PodResourcesServer(path, pods):
        root = _host(tmp_path, job.pid)
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(
            rundir, TPU_TOOLS_SYSROOT=str(root), TPU_TOOLS_POD_RESOURCES_SOCKET=str(path)))
        assert result.returncode == 0, result.stderr
        processes = json.loads(result.stdout)["processes"]
        (agent,) = processes["agents"]
        assert agent["kubernetes"] == {"namespace": "ml", "pod": "train-0", "container": "trainer"}
        (holder,) = processes["holders"]
        assert holder["pid"] == 4001
        assert holder["kubernetes"]["pod"] == "eval-0"
        assert processes["pod_labels_error"] is None
        families = {f.name: f for f in process_metrics(msgspec.convert(processes, ProcessesGroup))}
        (sample,) = families["tpu_tools_agent_up"].samples
        assert sample.labels == {"pid": str(job.pid), "tag": "train", "namespace": "ml", "pod": "train-0",
                                 "container": "trainer"}


def test_absent_or_hanging_socket_means_no_labels_and_debug_says_why(tmp_path):
    path = _sock(tmp_path)
    with running_job(light=True, tag="train") as (job, rundir):
        root = _host(tmp_path, job.pid)
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), TPU_TOOLS_POD_RESOURCES_SOCKET=str(path))
        result = run_tool("tpu-monitor", "--count", "1", "--debug", env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["processes"]["agents"][0]["kubernetes"] is None
        assert f"tpu-monitor: no pod labels: no kubelet pod-resources socket at {path}" in result.stderr
        quiet = run_tool("tpu-monitor", "--count", "1", env=env)
        assert "pod labels" not in quiet.stderr
        with PodResourcesServer(path, []) as server:
            server.lister.hanging.set()
            result = run_tool("tpu-monitor", "--count", "1", "--agent-timeout", "0.5", "--debug", env=env,
                              timeout=60)  # the hang guard: the pod-resources server never answers
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            assert report["processes"]["agents"][0]["kubernetes"] is None
            assert "did not answer within 0.5 s" in report["processes"]["pod_labels_error"]
            assert "did not answer within 0.5 s" in result.stderr


def test_no_pod_labels_outside_kubernetes():
    families = {f.name: f for f in process_metrics(ProcessesGroup(agents=[AgentEntry(pid=7, tag="t")]))}
    assert families["tpu_tools_agent_up"].samples[0].labels == {"pid": "7", "tag": "t"}


def test_gpus_are_matched_by_the_uuid_the_nvidia_device_plugin_uses(tmp_path):
    path = _sock(tmp_path)
    with running_job(light=True, tag="serve") as (job, rundir):
        root = tmp_path / "root"
        sysroot.nvidia_host(root, holders={job.pid: [1]})
        (root / "proc" / str(job.pid) / "cgroup").write_text(CGROUPFS_V1)
        # /dev/nvidia1 is the GPU at 0000:18:00.0 (the fixture's minor numbers run against PCI order).
        info = root / "proc/driver/nvidia/gpus/0000:18:00.0/information"
        info.write_text(info.read_text() + "GPU UUID: \t GPU-5c1f0d2e-aaaa-bbbb-cccc-0123456789ab\n")
        pods = [pod("inference", "llm-7f9c", "server", "nvidia.com/gpu", ["GPU-5c1f0d2e-aaaa-bbbb-cccc-0123456789ab"])]
        with PodResourcesServer(path, pods):
            result = run_tool("tpu-monitor", "--count", "1", env=agent_env(
                rundir, TPU_TOOLS_SYSROOT=str(root), TPU_TOOLS_POD_RESOURCES_SOCKET=str(path)))
        assert result.returncode == 0, result.stderr
        (agent,) = json.loads(result.stdout)["processes"]["agents"]
        assert agent["kubernetes"] == {"namespace": "inference", "pod": "llm-7f9c", "container": "server"}
