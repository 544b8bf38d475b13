"""`tpu-monitor` end to end: the real console script, real agent processes, fixture hosts, faults."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import sysroot
from agentjobs import agent_env, rundir, running_job, start_job, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import DEFAULT_METRICS_ADDR, TESTS, UNMEASURED, assert_one_line_error, run_tool, tool_command

TOP_KEYS = {"schema", "time", "time_unix_s", "hostname", "sequence", "tpu_tools_version", "tpu_slice", "host",
            "devices", "processes", "libtpu", "workload", "nvml", "amdsmi", "diag"}
GROUP_HEADER = {"period_s", "sampled_at", "error"}
HOST_KEYS = GROUP_HEADER | {"hostname", "cpu_count", "cpu_percent", "memory_total_bytes", "memory_used_bytes",
                            "memory_available_bytes", "swap_total_bytes", "swap_used_bytes", "load_average_1m",
                            "load_average_5m", "load_average_15m", "uptime_s"}
DEVICES_KEYS = GROUP_HEADER | {"devices", "chips", "notes"}
DEVICE_KEYS = {"key", "platform", "id", "name", "chip_index", "pci_address", "memory_used_bytes",
               "memory_total_bytes", "memory_peak_bytes", "live_array_bytes", "live_array_count",
               "utilization_percent", "holders", "holders_source", "processes", "sources", "extra"}
PROCESSES_KEYS = GROUP_HEADER | {"agents", "holders", "ignored_sockets", "pod_labels_error",
                                 "global_metric_findings", "stall_findings",
                                 "shared_cache_dirs", "jobs"}
LIBTPU_KEYS = GROUP_HEADER | {"services", "notes"}
AGENT_KEYS = {"pid", "tag", "user", "command", "error", "socket", "uptime_s", "jax_version", "platform",
              "cpu_percent", "cpu_time_s", "rss_bytes", "threads", "device_memory_used_bytes", "live_array_bytes",
              "live_array_count", "devices", "compiles", "steps", "tpu_sdk", "query_time_s", "kubernetes",
              "goodput", "process_index", "process_count", "metrics", "metrics_rejected", "metrics_error",
              "compilation_cache", "slurm_job_id", "stalled_s", "frontend", "frontend_version", "executions",
              "transfers", "cpu_fallbacks", "startup", "job"}
COMPILE_KEYS = {"compile_count", "recompile_count", "trace_count", "trace_time_s", "lowering_time_s",
                "backend_compile_time_s", "cache_hits", "cache_misses", "in_memory_cache_hits", "functions",
                "recent_recompiles"}
STEP_KEYS = {"count", "steps_per_second", "last_step_time_s", "p50_step_time_s", "p99_step_time_s",
             "last_step_age_s"}


@pytest.fixture
def jax_job():
    # One test reads it: a job kept for the whole module would compute steps (and cost CPU) until its end.
    with running_job(tag="train-a", explain=True, host_devices=2) as started:
        yield started


def monitor(*args: str, rundir: Path, timeout: float = 60, **env: str) -> list[dict]:
    result = run_tool("tpu-monitor", *args, env=agent_env(rundir, **env), timeout=timeout)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_valid_report_with_no_accelerator_and_no_agent(rundir, tmp_path):
    sysroot.empty_host(tmp_path / "root")  # a host without accelerators, wherever the suite runs
    reports = monitor("--count", "2", "--period", "0.2", rundir=rundir, TPU_TOOLS_SYSROOT=str(tmp_path / "root"))
    assert len(reports) == 2
    assert [r["sequence"] for r in reports] == [0, 1]
    report = reports[0]
    assert set(report) == TOP_KEYS
    assert report["schema"] == "tpu-tools/monitor/v1"
    assert set(report["host"]) == HOST_KEYS
    assert report["host"]["error"] is None
    assert report["host"]["memory_total_bytes"] > report["host"]["memory_used_bytes"] > 0
    assert set(report["devices"]) == DEVICES_KEYS
    assert report["devices"]["devices"] == []
    assert set(report["processes"]) == PROCESSES_KEYS
    assert report["processes"]["agents"] == []
    assert set(report["libtpu"]) == LIBTPU_KEYS
    assert report["libtpu"]["notes"] == []
    assert report["libtpu"]["error"] == f"no metrics service at {DEFAULT_METRICS_ADDR} (connection refused)"
    assert [s["address"] for s in report["libtpu"]["services"]] == [DEFAULT_METRICS_ADDR]
    assert all(report[g]["period_s"] == 0.2 for g in ("host", "devices", "processes", "libtpu"))


def test_agent_figures_in_the_report(jax_job, tmp_path):
    job, path = jax_job
    sysroot.empty_host(tmp_path / "root")  # the job's devices alone, wherever the suite runs

    def walked() -> dict | None:  # the job's published snapshot counts its live arrays at most once a second
        found = monitor("--count", "1", rundir=path, TPU_TOOLS_SYSROOT=str(tmp_path / "root"))[0]
        return found if all(a["live_array_count"] for a in found["processes"]["agents"]) else None

    report = wait_for(walked, timeout=30)
    [agent] = report["processes"]["agents"]
    assert set(agent) == AGENT_KEYS
    assert agent["pid"] == job.pid
    assert agent["tag"] == "train-a"
    assert agent["error"] is None
    assert agent["frontend"] == "jax"
    assert agent["frontend_version"] == agent["jax_version"]
    assert agent["cpu_fallbacks"] is None
    assert agent["transfers"] is None  # torch_xla's figures only
    assert agent["rss_bytes"] > 0
    assert agent["threads"] > 0
    assert agent["platform"] == "cpu"
    assert agent["device_memory_used_bytes"] >= 2 * 256 * 1024 * 4
    assert agent["live_array_count"] >= 2
    assert set(agent["compiles"]) == COMPILE_KEYS
    assert agent["compiles"]["recompile_count"] >= 1
    assert any(f["name"] == "train_step" and f["last_recompile_reason"] for f in agent["compiles"]["functions"])
    assert set(agent["steps"]) == STEP_KEYS
    assert agent["steps"]["count"] >= 20
    devices = report["devices"]["devices"]
    assert [d["key"] for d in devices] == [f"cpu:0@{job.pid}", f"cpu:1@{job.pid}"]
    for device in devices:
        assert set(device) == DEVICE_KEYS
        assert device["processes"] == [{"pid": job.pid, "tag": "train-a"}]
        assert device["sources"] == ["agent"]
        assert device["live_array_bytes"] >= 256 * 1024 * 4


def test_tpu_host_from_passive_discovery_with_holders(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={os.getpid(): [0, 1]})
    report = monitor("--count", "1", rundir=rundir, TPU_TOOLS_SYSROOT=str(root))[0]
    devices = report["devices"]["devices"]
    assert len(devices) == 8
    assert all(d["platform"] == "tpu" and d["name"] == "TPU v5e" for d in devices)
    assert [d["key"] for d in devices] == [f"tpu:{i}" for i in range(8)]
    assert devices[0]["memory_total_bytes"] == 16 << 30
    assert [h["pid"] for h in devices[0]["holders"]] == [os.getpid()]
    assert devices[2]["holders"] == []
    [holder] = report["processes"]["holders"]
    assert holder["pid"] == os.getpid()
    assert holder["chips"] == [0, 1]
    assert holder["rss_bytes"] > 0


def test_config_chooses_groups_periods_and_tags(rundir, tmp_path):
    keep = start_job(rundir, tag="train-keep", light=True, launcher=False)
    drop = start_job(rundir, tag="eval-drop", light=True, launcher=False)
    try:
        keep.wait_ready()
        drop.wait_ready()
        config = tmp_path / "monitor.toml"
        config.write_text('period = "300ms"\ntag_filter = "^train"\n'
                          '[groups.processes]\n[groups.host]\nperiod = "30s"\n')
        reports = monitor("--config", str(config), "--count", "3", rundir=rundir)
        assert [set(r) - {"schema", "time", "time_unix_s", "hostname", "sequence", "tpu_tools_version", "tpu_slice"}
                for r in reports] == [{"processes", "host"}] * 3
        assert list(reports[0])[-2:] == ["host", "processes"]  # the report's own order, whatever the config's
        assert [a["tag"] for a in reports[0]["processes"]["agents"]] == ["train-keep"]
        assert reports[0]["processes"]["period_s"] == 0.3
        assert reports[0]["host"]["period_s"] == 30.0
        # The host group is taken once and repeated; processes every report.
        assert len({r["host"]["sampled_at"] for r in reports}) == 1
        assert len({r["processes"]["sampled_at"] for r in reports}) == 3
        json_config = tmp_path / "monitor.json"
        json_config.write_text(json.dumps({"groups": ["processes"], "tag_filter": "drop$"}))
        report = monitor("--config", str(json_config), "--count", "1", rundir=rundir)[0]
        assert "host" not in report
        assert [a["tag"] for a in report["processes"]["agents"]] == ["eval-drop"]
        # The command line wins over the config.
        report = monitor("--config", str(json_config), "--tag-filter", "keep", "--count", "1", rundir=rundir)[0]
        assert [a["tag"] for a in report["processes"]["agents"]] == ["train-keep"]
    finally:
        keep.stop()
        drop.stop()


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("a.toml", "perid = 1\n", "unknown key 'perid' at the top level"),
    ("b.toml", "[groups.host]\nperiod = 1\nfoo = 2\n", "unknown key 'foo' in groups.host"),
    ("c.toml", "[groups.gpus]\n", "unknown group 'gpus'"),
    ("d.toml", "period = 0\n", "period must be greater than 0"),
    ("e.toml", "period = -2\n", "greater than 0"),
    ("f.toml", 'period = "fast"\n', "is not a duration"),
    ("g.toml", '[groups.host]\nperiod = "10x"\n', "groups.host.period '10x' is not a duration"),
    ("h.toml", 'tag_filter = "(unclosed"\n', "not a valid regular expression"),
    ("i.toml", "period = [1\n", "not valid TOML"),
    ("j.json", '{"period": 1,}', "not valid JSON"),
    ("k.json", "[1, 2]", "must hold a table"),
    ("l.toml", "period = true\n", "must be a duration"),
    ("m.toml", "metrics_addr = 8431\n", "metrics_addr must be an address or a list of addresses"),
    ("n.toml", 'metrics_addr = ["localhost:8432", "nonsense"]\n', "metrics address 'nonsense' is not HOST:PORT"),
    ("o.toml", "metrics_timeout = 0\n", "metrics_timeout must be greater than 0"),
    ("p.toml", "[groups.libtpu]\naddress = 1\n", "unknown key 'address' in groups.libtpu"),
])
def test_bad_config_is_a_usage_error(rundir, tmp_path, name, text, fragment):
    config = tmp_path / name
    config.write_text(text)
    result = run_tool("tpu-monitor", "--config", str(config), "--count", "1", env=agent_env(rundir))
    message = assert_one_line_error(result, 2, fragment)
    assert message.startswith("tpu-monitor: error:")
    assert str(config) in message
    assert result.stdout == ""


@pytest.mark.parametrize("args", [
    ["--period", "0"], ["--period", "-1"], ["--period", "soon"], ["--count", "0"], ["--agent-timeout", "0"],
    ["--tag-filter", "[a-"], ["--config", "/nonexistent/monitor.toml"], ["--quiet"],
    ["--prometheus", "notaport"], ["--prometheus", "127.0.0.1:70000"],
    ["--metrics-addr", "nonsense"], ["--metrics-addr", "[::1"], ["--metrics-timeout", "0"],
])
def test_bad_options_are_usage_errors(rundir, args):
    result = run_tool("tpu-monitor", "--count", "1", *args, env=agent_env(rundir))
    assert_one_line_error(result, 2)
    assert result.stdout == ""


def _fake_agent(rundir: Path, tmp_path: Path, mode: str) -> subprocess.Popen:
    ready = tmp_path / f"ready-{mode}"
    process = subprocess.Popen([sys.executable, str(TESTS / "fakeagent.py"), str(rundir), str(ready), mode])
    wait_for(lambda: ready.exists() and ready.read_text(), timeout=20)
    return process


def test_faulty_sockets_and_agents_do_not_stop_the_report(rundir, tmp_path):
    good = start_job(rundir, tag="good", light=True, launcher=False)
    fakes = [_fake_agent(rundir, tmp_path, mode) for mode in ("garbage", "hang", "not-snapshot")]
    not_a_socket = rundir / "agent-999999.sock"
    not_a_socket.write_text("not a socket")
    os.chmod(not_a_socket, 0o600)
    loose = socket.socket(socket.AF_UNIX)
    loose.bind(str(rundir / "agent-999998.sock"))
    os.chmod(rundir / "agent-999998.sock", 0o666)
    try:
        good.wait_ready()
        report = monitor("--count", "1", "--agent-timeout", "1.5", rundir=rundir)[0]  # monitor()'s timeout: the guard
        group = report["processes"]
        assert group["error"] is None
        agents = {a["pid"]: a for a in group["agents"]}
        assert agents[good.pid]["error"] is None
        assert agents[good.pid]["tag"] == "good"
        garbage, hang, wrong = (agents[p.pid] for p in fakes)
        assert garbage["error"] == "answered something that is not JSON"
        assert garbage["tag"] is None
        assert hang["error"] == "no complete answer within 1.5 s"
        assert wrong["error"] == "answered something that is not an agent snapshot"
        ignored = {Path(i["socket"]).name: i["reason"] for i in group["ignored_sockets"]}
        assert "is not a socket" in ignored["agent-999999.sock"]
        assert "has mode 0666, not 0600" in ignored["agent-999998.sock"]
        assert not_a_socket.exists()  # never deleted: it is not ours to touch
    finally:
        loose.close()
        good.stop()
        for fake in fakes:
            fake.kill()
            fake.wait(timeout=10)


def test_a_socket_of_another_user_is_ignored(rundir):
    if os.getuid() != 0:
        pytest.skip("needs root to create a file owned by another user")
    nobody = pwd.getpwnam("nobody")
    foreign = socket.socket(socket.AF_UNIX)
    path = rundir / "agent-999997.sock"
    foreign.bind(str(path))
    os.chmod(path, 0o600)
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    try:
        report = monitor("--count", "1", rundir=rundir)[0]
        [ignored] = report["processes"]["ignored_sockets"]
        assert f"belongs to uid {nobody.pw_uid}, not to this user" in ignored["reason"]
        assert path.exists()
    finally:
        foreign.close()


def test_an_unsafe_runtime_directory_is_a_group_error(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    report = monitor("--count", "1", rundir=shared)[0]
    assert "has mode 0777, not 0700" in report["processes"]["error"]
    assert report["host"]["error"] is None
    assert report["devices"]["error"] is not None


def _stream(rundir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*tool_command("tpu-monitor"), *args], env=agent_env(rundir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _read_report(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    assert line.endswith("\n"), (line, process.stderr.read() if process.poll() is not None else "")
    return json.loads(line)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_processes_come_and_go_and_signals_end_it_cleanly(rundir, sig):
    first = start_job(rundir, tag="first", light=True, launcher=False).wait_ready()
    process = _stream(rundir, "--period", "0.2")
    second = None
    try:
        wait_for(lambda: [a["tag"] for a in _read_report(process)["processes"]["agents"]] == ["first"])
        second = start_job(rundir, tag="second", light=True, launcher=False).wait_ready()
        wait_for(lambda: sorted(a["tag"] for a in _read_report(process)["processes"]["agents"])
                 == ["first", "second"])
        first.stop(signal.SIGKILL)  # killed while monitored
        wait_for(lambda: [a["tag"] for a in _read_report(process)["processes"]["agents"]] == ["second"])
        assert process.poll() is None
        process.send_signal(sig)
        process.wait(timeout=20)
        # Read through the pipes' buffers: communicate() reads the raw descriptors and would miss the part of
        # a report that readline() already buffered, then see half a line.
        out, err = process.stdout.read(), process.stderr.read()
        assert process.returncode == 0
        assert err == ""
        assert out == "" or all(json.loads(line)["schema"] == "tpu-tools/monitor/v1" for line in out.splitlines())
        assert out == "" or out.endswith("\n")
    finally:
        process.kill()
        process.wait(timeout=10)
        first.stop()
        if second is not None:
            second.stop()


def test_a_closed_pipe_ends_it_quietly(rundir):
    # PIPESTATUS: tpu-monitor's own status, not head's (a pipeline's status is its last command's).
    command = " ".join(tool_command("tpu-monitor")) + ' --period 0.1 | head -n 1; exit "${PIPESTATUS[0]}"'
    result = subprocess.run(["bash", "-c", command], env=agent_env(rundir), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 141
    assert result.stderr == ""  # 128 + SIGPIPE, as coreutils end, and nothing said
    assert json.loads(result.stdout)["sequence"] == 0


def test_fifty_agents_at_once(rundir):
    # The first job's agent is measured by coverage; the 49 others run the same code (and would pay 6 s of CPU).
    jobs = [start_job(rundir, tag=f"n{i:02d}", light=True, launcher=False, extra_env=UNMEASURED if i else None)
            for i in range(50)]
    try:
        for job in jobs:
            job.wait_ready()
        report = monitor("--count", "1", "--agent-timeout", "5", rundir=rundir, timeout=120)[0]
        agents = report["processes"]["agents"]
        assert sorted(a["tag"] for a in agents) == [f"n{i:02d}" for i in range(50)]
        assert all(a["error"] is None and a["rss_bytes"] > 0 for a in agents)
    finally:
        for job in jobs:
            job.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_prometheus_serves_the_figures_and_drops_exited_processes(rundir):
    job = start_job(rundir, tag="scraped", light=True, launcher=False).wait_ready()
    port = _free_port()
    process = _stream(rundir, "--prometheus", str(port), "--quiet", "--period", "0.2")
    try:
        label = f'pid="{job.pid}",tag="scraped"'
        text = wait_for(lambda: (lambda t: t if f"tpu_tools_process_rss_bytes{{{label}}}" in t else None)(
            _safe_scrape(port)), timeout=30)
        assert f"tpu_tools_agent_up{{{label}}} 1.0" in text
        assert f"tpu_tools_process_steps_total{{{label}}}" in text
        assert "tpu_tools_host_memory_total_bytes " in text
        assert 'tpu_tools_host_load_average{window="1m"}' in text
        assert 'tpu_tools_group_error{group="processes"} 0.0' in text
        assert all(line.startswith(("#", "tpu_tools_")) for line in text.splitlines() if line)
        job.stop(signal.SIGKILL)
        wait_for(lambda: f'pid="{job.pid}"' not in _scrape(port), timeout=30)
        assert process.stdout.read(0) == ""
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
        assert process.returncode == 0
        assert out == ""
        assert err == ""
    finally:
        process.kill()
        process.wait(timeout=10)
        job.stop()


def _safe_scrape(port: int) -> str:
    try:
        return _scrape(port)
    except OSError:
        return ""


def test_prometheus_port_in_use_is_a_clear_error(rundir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_tool("tpu-monitor", "--prometheus", f"127.0.0.1:{port}", "--count", "1", env=agent_env(rundir))
    assert_one_line_error(result, 1, f"port {port} on 127.0.0.1 is already in use")
    assert result.stdout == ""
