"""tpu-dump's accelerators.libtpu and accelerators.agents: next to the fake metrics service and a real JAX job."""

from __future__ import annotations

import gzip
import json

import pytest
import sysroot
from agentjobs import agent_env, rundir, start_job  # noqa: F401 (rundir is a fixture)
from conftest import DEFAULT_METRICS_ADDR, assert_one_line_error, run_tool
from libtpu_server import FakeMetricsService, v5e_host
from test_dump_cli import _manifest, _members

from tpu_tools.dump.collectors.jobs import libtpu_deadline

SECRET = "Hx7-pl4nted-Cr3dential-Value-0042"


def _statuses(manifest: dict) -> dict[str, tuple[str, str | None]]:
    return {c["name"]: (c["status"], c["error"]) for c in manifest["collectors"]}


def test_dump_next_to_the_metrics_service(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    fixture = v5e_host()
    core = fixture.status.core_states[5]
    core.error_message += f" while writing to gs://ckpt (https://svc:{SECRET}@storage.internal/upload)"
    output = tmp_path / "b.tar.gz"
    env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), TPU_RUNTIME_METRICS_PORTS="8431,eight")
    with FakeMetricsService(fixture) as service:
        result = run_tool("tpu-dump", "--only", "accelerators", "--metrics-addr", service.address,
                          "--metrics-timeout", "1", "-o", str(output), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(output)
    statuses = _statuses(manifest)
    assert statuses["accelerators.libtpu"] == ("ok", None)
    assert statuses["accelerators.agents"][0] == "skipped"
    assert "no workload of this user runs the tpu-tools agent" in statuses["accelerators.agents"][1]
    assert manifest["options"]["metrics_addresses"] == [DEFAULT_METRICS_ADDR, service.address]
    libtpu_entry = next(c for c in manifest["collectors"] if c["name"] == "accelerators.libtpu")
    assert any("'eight' is not a port number" in note for note in libtpu_entry["notes"])  # recorded, not fatal
    members = _members(output)
    document = json.loads(members["accelerators/libtpu.json"])
    refused, ours = document["metrics"]
    assert "connection refused" in refused["error"]
    assert ours["error"] is None
    assert [d["hbm_used_bytes"] for d in ours["devices"]][:2] == [int(11.2 * (1 << 30)), int(11.4 * (1 << 30))]
    assert ours["devices"][0]["duty_cycle_percent"] == 87.5
    assert ours["devices"][0]["hlo_execution_time_us"]["p50"]
    status = document["runtime_status"][1]
    assert status["host_name"] == "t1v-n-5e8-w-0"
    assert status["cores"][5]["state"] == "error"
    assert "aborted" in members["accelerators/libtpu.txt"].decode()
    assert SECRET.encode() not in gzip.decompress(output.read_bytes())  # redacted like every collector's output
    assert next(f for f in manifest["files"] if f["name"] == "accelerators/libtpu.json")["redactions"]
    shown = run_tool("tpu-dump", "show", str(output), env=env)
    assert shown.returncode == 0, shown.stderr
    assert (f"libtpu     {service.address}: 8 devices, duty cycle 43.8%, HBM 89.9 GiB / 128.0 GiB; runtime status: "
            "8 cores, 1 in error") in shown.stdout.splitlines()
    warning = f"  libtpu_core_error: core 5 (chip 5, tensor core) at {service.address} is in error: program " \
              "0x3fa29c01 aborted: TensorCore halted on an HBM out-of-memory condition"
    assert any(line.startswith(warning) for line in shown.stdout.splitlines())
    summary = json.loads(run_tool("tpu-dump", "show", "--json", str(output), env=env).stdout)
    assert summary["libtpu"]["core_count"] == 8
    assert summary["agents"] is None
    assert [(c["address"], c["global_core_id"]) for c in summary["libtpu"]["cores_in_error"]] == [(service.address, 5)]


def test_dump_next_to_an_agent_attached_jax_job(rundir, tmp_path):
    job = start_job(rundir, tag="dumped", explain=True, extra_args=(f"--auth-token={SECRET}",)).wait_ready()
    output = tmp_path / "b.tar.gz"
    try:
        result = run_tool("tpu-dump", "--only", "accelerators.agents", "-o", str(output), env=agent_env(rundir))
    finally:
        job.stop()
    assert result.returncode == 0, result.stderr
    assert _statuses(_manifest(output))["accelerators.agents"] == ("ok", None)
    members = _members(output)
    document = json.loads(members["accelerators/agents.json"])
    [agent] = document["agents"]
    assert agent["pid"] == job.pid
    assert agent["tag"] == "dumped"
    assert agent["error"] is None
    snapshot = agent["snapshot"]
    assert snapshot["schema"] == "tpu-tools/agent/v1"
    assert snapshot["runtime"]["platform"] == "cpu"
    assert snapshot["compiles"]["recompile_count"] >= 1
    assert snapshot["steps"]["count"] >= 20
    assert SECRET not in snapshot["command"]
    assert "--auth-token=" in snapshot["command"]
    assert SECRET.encode() not in gzip.decompress(output.read_bytes())
    [stacks] = json.loads(members["accelerators/stacks.json"])["jobs"]
    assert (stacks["pid"], stacks["source"]) == (job.pid, "agent")
    assert stacks["stacks"]["threads"][0]["main"]
    assert f"process {job.pid} (agent), main thread in " in members["accelerators/stacks.txt"].decode()
    table = members["accelerators/agents.txt"].decode().splitlines()
    assert table[0].split()[:3] == ["PID", "TAG", "PLATFORM"]
    assert table[1].split()[:3] == [str(job.pid), "dumped",
                                                                                           "cpu"]
    shown = run_tool("tpu-dump", "show", str(output)).stdout
    agents_line = next(line for line in shown.splitlines() if line.startswith("agents     "))
    assert f"{job.pid} (dumped, cpu, " in agents_line
    assert " recompiles)" in agents_line
    assert f"  recompiles: process {job.pid} (dumped) compiled functions again" in shown
    assert "last: train_step: different input types" in shown


def test_dump_next_to_a_hanging_service_is_written_within_budget(rundir, tmp_path):
    output = tmp_path / "b.tar.gz"
    with FakeMetricsService(v5e_host()) as service:
        service.hang()
        result = run_tool("tpu-dump", "--only", "accelerators.libtpu,accelerators.agents", "--timeout", "5",
                          "--metrics-timeout", "0.3", "--metrics-addr", service.address, "-o", str(output),
                          env=agent_env(rundir), timeout=120)  # the hang guard
    assert result.returncode == 0, result.stderr
    manifest = _manifest(output)
    status, error = _statuses(manifest)["accelerators.libtpu"]
    assert status == "timed_out"
    assert error == f"the metrics service at {service.address} did not answer within 0.3 s"
    # Its own deadlines ended it, not the runner's hard stop at 5 s (that error would say "did not finish").
    document = json.loads(_members(output)["accelerators/libtpu.json"])
    assert "did not answer within 0.3 s" in document["metrics"][1]["error"]


def test_the_deadline_fits_the_collectors_remaining_time():
    assert libtpu_deadline(2.0, 20.0) == 2.0  # the default --timeout leaves room for --metrics-timeout
    assert libtpu_deadline(2.0, 2.0) == 0.25  # a probe and three calls within what is left, minus a margin
    assert libtpu_deadline(2.0, 0.5) == 0.05


def test_bad_metrics_address_is_a_usage_error(tmp_path):
    result = run_tool("tpu-dump", "--metrics-addr", "nonsense", "-o", str(tmp_path / "b.tar.gz"))
    assert_one_line_error(result, 2, "metrics address 'nonsense' is not HOST:PORT")
    assert list(tmp_path.iterdir()) == []


def test_a_bundles_libtpu_file_is_summarised_or_refused_with_the_field_named():
    from tpu_tools.dump.libtpusummary import libtpu_summary
    from tpu_tools.outside import OutsideError

    device = {"device_id": 0, "hbm_used_bytes": 1 << 30, "hbm_total_bytes": 16 << 30, "duty_cycle_percent": 43.777}
    document = {"metrics": [{"address": "a:1", "devices": [device, {**device, "device_id": 1}]}],
                "runtime_status": [{"address": "a:1", "cores": [{"global_core_id": 3, "state": "error",
                                                                   "error_message": "halted"}, {"state": "ok"}]}]}
    summary = libtpu_summary(document)
    (service,) = summary.services
    assert (service.device_count, service.hbm_used_bytes, service.duty_cycle_percent) == (2, 2 << 30, 43.78)
    assert summary.core_count == 2
    assert [c.global_core_id for c in summary.cores_in_error] == [3]
    document["metrics"][0]["devices"][1]["device_id"] = "1"
    with pytest.raises(OutsideError, match=r"got `str` - at `\$\.metrics\[0\]\.devices\[1\]\.device_id`"):
        libtpu_summary(document)
