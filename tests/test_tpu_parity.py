"""Everything tpu-info reads, through tpu-tools' commands: slice awareness, every libtpu metric, the SDK
metrics an agent reads in its job, and --list-metrics. Fixture TPU VMs (sysfs + DMI + environment), the
fake runtime metrics service and a stand-in `libtpu` package; a GCE metadata stand-in on 127.0.0.1."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sysroot
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import DEFAULT_METRICS_ADDR, clean_env, run_tool, tool_command
from libtpu_server import (
    D2H_LATENCY,
    TCP_DELIVERY_RATE,
    FakeMetricsService,
    v5p_host,
    v6e_host,
)
from test_monitor_cli import _free_port, _safe_scrape

from tpu_tools.pjrt.tpuvm import METADATA_URL_VARIABLE, slice_info

TESTS = Path(__file__).resolve().parent
FAKE_LIBTPU = TESTS / "fake_libtpu"
OLD_LIBTPU = TESTS / "old_libtpu"
TPU_INFO_LATENCIES = {"dcn_transfer_latencies", "dcn_inbound_transfer_latencies",
                      "host_to_device_transfer_latencies", "device_to_host_transfer_latencies",
                      "collective_end_to_end_latencies", "mxla_compute_latencies", "grpc_tcp_min_rtt"}


# --- slice awareness -------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", sorted(sysroot.TPU_VMS))
def test_tpu_ls_names_the_slice_and_worker_of_every_tpu_vm_generation(tmp_path, generation):
    _, environment = sysroot.tpu_vm(tmp_path, generation, worker=1)
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), **environment)
    document = json.loads(run_tool("tpu-ls", "--json", "--no-runtime", env=env).stdout)
    text = run_tool("tpu-ls", "--no-runtime", env=env).stdout
    accelerator_type, workers = sysroot.TPU_VMS[generation][1:3]
    info = document["tpu_slice"]
    assert info["gce_vm"] is True
    assert info["source"] == "environment"
    assert (info["accelerator_type"], info["worker_id"], len(info["worker_hostnames"])) == (accelerator_type, 1,
                                                                                            workers)
    assert info["labels"] == {"slice": info["slice"], "worker": "1"}
    assert info["slice"].startswith(accelerator_type)
    assert info["notes"] == ["TPU_SKIP_MDS_QUERY is set: the metadata server was not asked"]
    assert f"slice {accelerator_type} ({info['slice']}), worker 1 of {workers}" in text.splitlines()[0]


def test_every_worker_of_a_slice_gets_the_same_slice_label_and_its_own_worker(tmp_path):
    _, environment = sysroot.tpu_vm(tmp_path, "v5p", worker=0)
    labels = [slice_info({**environment, "TPU_WORKER_ID": str(w)}, root=tmp_path).labels() for w in range(4)]
    assert len({label["slice"] for label in labels}) == 1
    assert [label["worker"] for label in labels] == ["0", "1", "2", "3"]
    other = slice_info({**environment, "TPU_WORKER_HOSTNAMES": "a,b,c,d"}, root=tmp_path).labels()
    assert other["slice"] != labels[0]["slice"]  # another slice of the same type
    named = slice_info({**environment, "TPU_NAME": "train-5p", "MEGASCALE_NUM_SLICES": "2",
                        "MEGASCALE_SLICE_ID": "1"}, root=tmp_path)
    assert named.labels() == {"slice": "train-5p/1", "worker": "0"}


def test_a_host_that_is_no_tpu_vm_has_no_slice(tmp_path):
    sysroot.nvidia_host(tmp_path)
    info = slice_info({}, root=tmp_path)
    assert not info.known
    assert info.labels() == {}
    assert info.source == "none"
    assert not info.gce_vm


class _MetadataServer:
    """A stand-in for the GCE metadata server on 127.0.0.1 (tests never reach the real one)."""

    def __init__(self, attributes: dict[str, str], delay_s: float = 0.0):
        requests: list[tuple[str, str | None]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                requests.append((self.path, self.headers.get("Metadata-Flavor")))
                time.sleep(delay_s)
                key = self.path.rsplit("/", 1)[-1]
                body = attributes.get(key)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args):
                pass

        self.requests = requests
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/computeMetadata/v1/instance/attributes/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


TPU_ENV_ATTRIBUTE = textwrap.dedent("""\
    ACCELERATOR_TYPE: 'v6e-16'
    NODE_ID: 'train-6e'
    WORKER_ID: '2'
    TOPOLOGY: '4x4'
    ZONE: 'us-east5-b'
""")


def test_a_gce_tpu_vm_without_environment_asks_the_metadata_server(tmp_path):
    sysroot.v6e_host(tmp_path)
    sysroot.dmi(tmp_path)
    server = _MetadataServer({"tpu-env": TPU_ENV_ATTRIBUTE, "accelerator-type": "v6e-16",
                              "agent-worker-number": "2",
                              "worker-network-endpoints": "a:0:10.0.0.1,b:1:10.0.0.2,c:2:10.0.0.3,d:3:10.0.0.4"})
    try:
        info = slice_info({METADATA_URL_VARIABLE: server.url}, root=tmp_path)
    finally:
        server.close()
    assert info.source == "metadata"
    assert info.notes == []
    assert (info.accelerator_type, info.worker_id, info.name, info.topology) == ("v6e-16", 2, "train-6e", "4x4")
    assert info.worker_hostnames == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert info.labels() == {"slice": "train-6e", "worker": "2"}
    assert server.requests
    assert all(flavor == "Google" for _, flavor in server.requests)


@pytest.mark.parametrize("case", ["not a GCE VM", "no TPU chips", "TPU_SKIP_MDS_QUERY", "environment complete"])
def test_the_metadata_server_is_not_asked_where_it_must_not_be(tmp_path, case):
    if case != "no TPU chips":
        sysroot.v6e_host(tmp_path)
    else:
        sysroot.nvidia_host(tmp_path)
    if case != "not a GCE VM":
        sysroot.dmi(tmp_path)
    server = _MetadataServer({"tpu-env": TPU_ENV_ATTRIBUTE})
    environment = {METADATA_URL_VARIABLE: server.url}
    if case == "TPU_SKIP_MDS_QUERY":
        environment["TPU_SKIP_MDS_QUERY"] = "true"
    if case == "environment complete":
        environment.update(TPU_ACCELERATOR_TYPE="v6e-16", TPU_WORKER_ID="0", TPU_WORKER_HOSTNAMES="a,b",
                           TPU_NAME="six")
    try:
        info = slice_info(environment, root=tmp_path)
    finally:
        server.close()
    assert server.requests == []
    assert info.source == ("environment" if len(environment) > 1 else "none")


def test_a_slow_metadata_server_costs_its_deadline_and_a_note(tmp_path):
    sysroot.v6e_host(tmp_path)
    sysroot.dmi(tmp_path)
    server = _MetadataServer({"tpu-env": TPU_ENV_ATTRIBUTE}, delay_s=3.0)
    try:
        info = slice_info({METADATA_URL_VARIABLE: server.url}, root=tmp_path, metadata_timeout_s=0.3)
    finally:
        server.close()
    assert not info.known  # the answer would come after 3 s and make the slice known: the deadline ended it
    assert len(info.notes) == 1
    assert info.notes[0].startswith("the GCE metadata server did not answer")


# --- every libtpu metric tpu-info reads, through each command's JSON -------------------------------------

@pytest.fixture
def v5p_worker(tmp_path):
    _, environment = sysroot.tpu_vm(tmp_path, "v5p", worker=3, holders={4242: [0, 1, 2, 3]})
    return clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), **environment)


def _check_v5p_service(service: dict) -> None:
    assert service["error"] is None
    devices = service["devices"]
    assert [d["duty_cycle_percent"] for d in devices] == [91.0, 92.5, None, None]  # NaN and 150 % unreadable
    assert [d["hbm_bandwidth_utilization_percent"] for d in devices] == [40.0, 41.0, 42.0, 43.0]
    assert [d["tensorcore_idle_duration_s"] for d in devices] == [0.01, 0.02, 0.03, 0.04]
    assert [d["hlo_queue_size"] for d in devices] == [0, 1, 2, 3]
    assert all(d["hlo_execution_time_us"]["count"] == 50 for d in devices)
    latencies = {t["name"]: t for t in service["transfer_latencies"]}
    assert set(latencies) == TPU_INFO_LATENCIES
    assert latencies["device_to_host_transfer_latencies"]["latency_us"]["count"] == 0  # empty: no samples
    assert latencies["grpc_tcp_min_rtt"]["latency_us"]["count"] == 70
    (rate,) = service["delivery_rates"]
    assert rate["name"] == "grpc_tcp_delivery_rate"
    assert rate["rate_mbps"]["count"] == 70
    assert 8000 < rate["rate_mbps"]["p50"] < 10500
    assert service["unread_metrics"] == ["megascale.grpc_tcp_something.furlongs.cumulative.distribution"]
    assert any("tpu.runtime.tensorcore.dutycycle.percent: skipped 2 data points" in n for n in service["notes"])


def test_every_metric_in_tpu_ls_json(v5p_worker):
    # JAX_PLATFORMS unset: the platform left to JAX, as a plain `tpu-ls` leaves it, also where the suite pins the
    # CPU platform (a host with an accelerator plugin); the fixture host decides, and nothing opens a device
    env = {key: value for key, value in v5p_worker.items() if key != "JAX_PLATFORMS"}
    with FakeMetricsService(v5p_host()) as service:
        document = json.loads(run_tool("tpu-ls", "--json", "--metrics-addr", service.address, env=env).stdout)
    _check_v5p_service(document["libtpu_metrics"][1])
    assert document["runtime_status"] == "held"
    assert document["tpu_slice"]["accelerator_type"] == "v5p-32"


def _exporting_monitor(env: dict[str, str], reports: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """tpu-monitor serving Prometheus and writing its JSON reports to `reports`: one process gives both (a
    second, --count 1 run would cost another start)."""
    port = _free_port()
    with open(reports, "w") as out:
        process = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", str(port), "--period", "0.3", *args],
                                   env=env, stdout=out, stderr=subprocess.PIPE, text=True)
    return process, port


def _first_report(reports: Path) -> dict:
    def first_line() -> str:
        text = reports.read_text()
        return text[:text.index("\n")] if "\n" in text else ""

    return json.loads(wait_for(first_line, 30))


def _stop_monitor(process: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM; its exit status and stderr."""
    process.terminate()
    try:
        _, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def test_every_metric_in_tpu_monitor_json_and_prometheus_with_slice_labels(v5p_worker, rundir, tmp_path):
    reports = tmp_path / "reports.jsonl"
    with FakeMetricsService(v5p_host()) as service:
        process, port = _exporting_monitor({**agent_env(rundir), **v5p_worker}, reports, "--metrics-addr",
                                           service.address)
        try:
            report = _first_report(reports)
            text = wait_for(lambda: (lambda t: t if "tcp_delivery_rate" in t else "")(_safe_scrape(port)), 30)
        finally:
            status, err = _stop_monitor(process)
    assert status == 0, err
    (snapshot,) = [s for s in report["libtpu"]["services"] if s["address"] == service.address]
    _check_v5p_service(snapshot)
    slice_label = report["tpu_slice"]["slice"]
    assert report["tpu_slice"]["labels"] == {"slice": slice_label, "worker": "3"}
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert series
    assert all(f'slice="{slice_label}"' in line and 'worker="3"' in line for line in series)
    assert any(line.startswith("tpu_tools_libtpu_tcp_delivery_rate_bytes_per_second_bucket{") for line in series)
    assert any('metric="dcn_inbound_transfer_latencies"' in line for line in series)


# --- the libtpu SDK, read by the agent in the job --------------------------------------------------------

SDK_JOB = textwrap.dedent("""
    import os, sys, time
    ready, lifetime = sys.argv[1], float(sys.argv[2])
    if sys.argv[3] == "libtpu":
        import libtpu  # as a TPU job does (jax's TPU backend imports it)
    import tpu_tools.agent as agent
    agent.start(tag="sdk")
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + lifetime
    while time.time() < deadline:
        time.sleep(0.05)
""")


def _sdk_job(rundir: Path, tmp_path: Path, library: Path | None) -> subprocess.Popen:
    script, ready = tmp_path / "sdk_job.py", tmp_path / "ready"
    script.write_text(SDK_JOB)
    env = agent_env(rundir, PYTHONPATH=str(library) if library else "")
    process = subprocess.Popen([sys.executable, str(script), str(ready), "60", "libtpu" if library else "none"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for(lambda: ready.exists() and ready.read_text(), 30)
    return process


@pytest.mark.parametrize(("library", "status"), [
    (FAKE_LIBTPU, "ok"),
    (OLD_LIBTPU, "not served by this runtime (libtpu.sdk: ImportError)"),
    (None, "libtpu is not loaded in this process"),
])
def test_the_agent_serves_tensorcore_utilization_from_the_sdk(rundir, tmp_path, library, status):
    process = _sdk_job(rundir, tmp_path, library)

    def list_metrics() -> dict:
        return json.loads(run_tool("tpu-monitor", "--list-metrics", env=agent_env(rundir)).stdout)

    def asked_again() -> dict | None:
        found = list_metrics()
        return found if "not asked again" in json.dumps(found) else None

    try:
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
        listing = list_metrics()
        if library is FAKE_LIBTPU:  # the SDK is read at most once a second: a later read says what it did not ask
            listing = wait_for(asked_again, 30)
    finally:
        process.kill()
        process.wait(10)
    assert result.returncode == 0, result.stderr
    (agent,) = json.loads(result.stdout)["processes"]["agents"]
    sdk = agent["tpu_sdk"]
    assert sdk["status"] == status
    (source,) = [s for s in listing["sources"] if s["kind"] == "agent"]
    if library is FAKE_LIBTPU:
        # only what the metrics service does not serve; a metric that failed is not asked again
        assert sdk["tensorcore_utilization_percent"] == [91.5, 88.0, 0.0, 47.25]
        assert sdk["metrics"] == ["ici_link_health", "tensorcore_util", "tpu_throttle_score"]
        assert sdk["unreadable"] == {"hbm_util": "RuntimeError: vbar control agent missing"}
        assert {m["name"]: m["status"] for m in source["metrics"]} == {
            "ici_link_health": "read", "tensorcore_util": "read", "tpu_throttle_score": "read",
            "hbm_util": "unreadable: not asked again: RuntimeError: vbar control agent missing"}
    else:
        assert sdk["tensorcore_utilization_percent"] is None
        assert sdk["metrics"] == []
        assert source["error"] == status


def test_out_of_range_sdk_values_are_unreadable_not_reported(rundir, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TPU_TENSORCORE_UTIL", "50,nan,170,-3,abc")
    process = _sdk_job(rundir, tmp_path, FAKE_LIBTPU)
    try:
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
    finally:
        process.kill()
        process.wait(10)
    (agent,) = json.loads(result.stdout)["processes"]["agents"]
    assert agent["tpu_sdk"]["tensorcore_utilization_percent"] == [50.0, None, None, None, None]
    assert "NaN" not in result.stdout


# --- --list-metrics --------------------------------------------------------------------------------------

def test_list_metrics_names_what_each_service_serves_and_what_it_does_not(rundir):
    with FakeMetricsService(v6e_host()) as service:
        env = agent_env(rundir)
        document = json.loads(run_tool("tpu-ls", "--list-metrics", "--json", "--metrics-addr", service.address,
                                       env=env).stdout)
        table = run_tool("tpu-ls", "--list-metrics", "--metrics-addr", service.address, env=env)
    assert document["schema"] == "tpu-tools/list-metrics/v1"
    default, ours = document["sources"]
    assert default["source"] == DEFAULT_METRICS_ADDR
    assert "connection refused" in default["error"]
    statuses = {m["name"]: m["status"] for m in ours["metrics"]}
    assert statuses["tpu.runtime.hbm.memory.usage.bytes"] == "read"
    assert statuses["tpu.runtime.sparsecore.future.metric"] == "served, not read"
    assert statuses[TCP_DELIVERY_RATE] == "not served"
    assert statuses[D2H_LATENCY] == "not served"
    assert table.returncode == 0
    assert table.stderr == ""
    lines = [line.split() for line in table.stdout.splitlines()]
    assert ["libtpu", service.address, "tpu.runtime.sparsecore.future.metric", "served,", "not", "read"] in lines


# --- Orbax and Grain metrics the job exports itself ------------------------------------------------------

JOB_EXPOSITION = textwrap.dedent("""\
    # HELP jax_orbax_write_gbytes Bytes written by the last checkpoint.
    # TYPE jax_orbax_write_gbytes gauge
    jax_orbax_write_gbytes 12.5
    # HELP jax_checkpoint_write_async_total_duration_secs Async checkpoint time.
    # TYPE jax_checkpoint_write_async_total_duration_secs gauge
    jax_checkpoint_write_async_total_duration_secs{storage_type="gcs"} 41.0
    # HELP grain_python_dataset_next_duration_ns Time of next() on the dataset.
    # TYPE grain_python_dataset_next_duration_ns gauge
    grain_python_dataset_next_duration_ns NaN
    # HELP grain_python_data_sources_bytes_read Bytes read by source.
    # TYPE grain_python_data_sources_bytes_read counter
    grain_python_data_sources_bytes_read_total{source="ArrayRecord"} 1048576.0
    # HELP process_cpu_seconds_total Not a workload metric.
    # TYPE process_cpu_seconds_total counter
    process_cpu_seconds_total 3.0
""")


class _ExpositionServer(_MetadataServer):
    def __init__(self, text: str):
        super().__init__({"metrics": text})


def test_orbax_and_grain_metrics_in_the_monitor_report_and_prometheus(rundir, tmp_path):
    server = _ExpositionServer(JOB_EXPOSITION)
    port = str(server.server.server_address[1])
    env = agent_env(rundir, ORBAX_PROMETHEUS_PORT=port, PYGRAIN_PROMETHEUS_PORT=port)
    reports = tmp_path / "reports.jsonl"
    process, exporter = _exporting_monitor(env, reports)
    try:
        report = _first_report(reports)
        text = wait_for(lambda: (lambda t: t if "orbax" in t else "")(_safe_scrape(exporter)), 30)
    finally:
        status, err = _stop_monitor(process)
        server.close()
    assert status == 0, err
    (endpoint,) = report["workload"]["endpoints"]
    assert endpoint["error"] is None
    assert endpoint["sources"] == ["orbax", "grain"]
    families = {f["name"].removesuffix("_total"): f for f in endpoint["families"]}
    assert set(families) == {"jax_orbax_write_gbytes", "jax_checkpoint_write_async_total_duration_secs",
                             "grain_python_dataset_next_duration_ns", "grain_python_data_sources_bytes_read"}
    assert families["jax_orbax_write_gbytes"]["samples"][0]["value"] == 12.5
    assert families["grain_python_dataset_next_duration_ns"]["samples"][0]["value"] is None  # NaN: null
    assert families["grain_python_data_sources_bytes_read"]["source"] == "grain"
    assert "NaN" not in reports.read_text()
    assert f'tpu_tools_jax_checkpoint_write_async_total_duration_secs{{endpoint="127.0.0.1:{port}",' \
           f'storage_type="gcs"}} 41.0' in text
    assert "tpu_tools_process_cpu_seconds_total" not in text


def test_an_absent_or_garbled_job_endpoint_is_one_error(rundir):
    free = str(_free_port())
    result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir, ORBAX_PROMETHEUS_PORT=free,
                                                                    PYGRAIN_PROMETHEUS_PORT="not-a-port"))
    endpoints = {e["address"]: e for e in json.loads(result.stdout)["workload"]["endpoints"]}
    assert "no metrics endpoint" in endpoints[f"127.0.0.1:{free}"]["error"]
    assert set(endpoints) == {f"127.0.0.1:{free}", "127.0.0.1:9431"}
    server = _ExpositionServer("jax_orbax_write_gbytes{oops 1\n")
    try:
        port = str(server.server.server_address[1])
        garbled = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir, ORBAX_PROMETHEUS_PORT=port))
    finally:
        server.close()
    endpoint = next(e for e in json.loads(garbled.stdout)["workload"]["endpoints"] if e["sources"] == ["orbax"])
    assert "unreadable text" in endpoint["error"]
    assert endpoint["families"] == []


# --- GKE's TPU device plugin -----------------------------------------------------------------------------

_POD = 'container="trainer",make="cloud-tpu",model="tpu-v5-lite-podslice",namespace="ml",pod="train-0"'
PLUGIN_EXPOSITION = "".join([
    "# HELP duty_cycle Percent of time the accelerator was busy.\n# TYPE duty_cycle gauge\n",
    f'duty_cycle{{accelerator_id="4804-0",{_POD}}} 93\n',
    f'duty_cycle{{accelerator_id="4804-1",{_POD}}} 250\n',
    "# HELP memory_used Bytes of HBM in use.\n# TYPE memory_used gauge\n",
    f'memory_used{{accelerator_id="4804-0",{_POD}}} 1.2e+10\n',
    f'memory_used{{accelerator_id="4804-1",{_POD}}} 1.1e+10\n',
    "# HELP memory_total Bytes of HBM.\n# TYPE memory_total gauge\n",
    f'memory_total{{accelerator_id="4804-0",{_POD}}} 1.7179869184e+10\n',
    f'memory_total{{accelerator_id="4804-1",{_POD}}} 1.7179869184e+10\n',
])



def test_the_gke_tpu_device_plugin_is_one_more_source(rundir, tmp_path):
    server = _ExpositionServer(PLUGIN_EXPOSITION)
    address = f"127.0.0.1:{server.server.server_address[1]}"
    env = agent_env(rundir, TPU_DEVICE_PLUGIN_METRICS_ADDR=address)
    reports = tmp_path / "reports.jsonl"
    process, exporter = _exporting_monitor(env, reports)
    try:
        report = _first_report(reports)
        text = wait_for(lambda: (lambda t: t if "device_plugin" in t else "")(_safe_scrape(exporter)), 30)
    finally:
        status, err = _stop_monitor(process)
        server.close()
    assert status == 0, err
    plugin = report["workload"]["device_plugin"]
    assert plugin["address"] == address
    assert plugin["error"] is None
    first, second = plugin["accelerators"]
    assert (first["accelerator_id"], first["pod"], first["namespace"], first["container"]) == ("4804-0", "train-0",
                                                                                               "ml", "trainer")
    assert first["duty_cycle_percent"] == 93.0
    assert first["memory_used_bytes"] == 1.2e10
    assert second["duty_cycle_percent"] is None  # 250 %: unreadable
    assert plugin["notes"] == ["skipped 1 samples with no accelerator id or an unreadable value"]
    assert 'tpu_tools_device_plugin_duty_cycle_ratio{accelerator_id="4804-0",container="trainer",' \
           'model="tpu-v5-lite-podslice",namespace="ml",pod="train-0"} 0.93' in text


def test_the_device_plugin_is_not_asked_off_kubernetes(rundir):
    result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
    plugin = json.loads(result.stdout)["workload"]["device_plugin"]
    assert plugin == {"address": None, "error": None, "accelerators": [], "notes": []}


def test_version_names_libtpu_and_the_accelerator_type_as_tpu_info_does(tmp_path):
    _, environment = sysroot.tpu_vm(tmp_path / "host", "v5e", worker=0)
    site = tmp_path / "site"
    (site / "libtpu-0.0.21.dist-info").mkdir(parents=True)  # an installed libtpu, as pip leaves it
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path / "host"), PYTHONPATH=str(site), **environment)
    lines = run_tool("tpu-ls", "--version", env=env).stdout.splitlines()
    assert "libtpu 0.0.21" in lines
    assert lines[-1] == "accelerator: 8 x TPU v5e (slice v5litepod-16)"
    bare = run_tool("tpu-ls", "--version", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path / "empty")))
    assert bare.stdout.splitlines()[-1] == "accelerator: none found"


# --- single-metric queries -------------------------------------------------------------------------------

def test_single_metric_queries_by_tpu_info_name_and_by_libtpu_name(v5p_worker):
    with FakeMetricsService(v5p_host()) as service:
        def query(*names):
            args = [arg for name in names for arg in ("--metric", name)]
            return run_tool("tpu-ls", *args, "--json", "--metrics-addr", service.address, env=v5p_worker)

        document = json.loads(query("hbm_usage", "grpc_tcp_delivery_rate", "core_state",
                                    "tpu.runtime.tensorcore.dutycycle.percent").stdout)
        table = run_tool("tpu-ls", "--metric", "buffer_transfer_latency", "--metrics-addr", service.address,
                         env=v5p_worker)
    assert document["schema"] == "tpu-tools/metric/v1"
    hbm, rate, cores, duty = document["metrics"]
    assert [row["hbm_used_bytes"] for row in hbm["rows"]] == [(60 + d) << 30 for d in range(4)]
    refused = f"no metrics service at {DEFAULT_METRICS_ADDR} (connection refused)"
    assert hbm["notes"] == [f"{DEFAULT_METRICS_ADDR}: {refused}"]
    (rate_row,) = rate["rows"]
    assert rate_row["count"] == 70
    assert set(rate_row) == {"service", "label", "count", "mean", "p50", "p90", "p95",
                                                          "p999"}
    assert [row["core"] for row in cores["rows"]] == list(range(8))
    assert cores["rows"][0]["state"] == "ok"
    assert duty["name"] == "duty_cycle_percent"
    assert [r["duty_cycle_percent"] for r in duty["rows"]][:2] == [91.0,
                                                                                                          92.5]
    assert table.returncode == 0
    assert "buffer_transfer_latency" in table.stdout
    assert "8MB" in table.stdout


def test_a_metric_nobody_knows_is_a_usage_error():
    result = run_tool("tpu-ls", "--metric", "hbm_usge")
    assert result.returncode == 2
    assert "unknown metric 'hbm_usge'; known: hbm_usage" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_tensorcore_utilization_query_reads_the_agents(rundir, tmp_path):
    process = _sdk_job(rundir, tmp_path, FAKE_LIBTPU)
    try:
        document = json.loads(run_tool("tpu-ls", "--metric", "tensorcore_utilization", "--json",
                                       env=agent_env(rundir)).stdout)
    finally:
        process.kill()
        process.wait(10)
    (result,) = document["metrics"]
    assert [row["utilization_percent"] for row in result["rows"]] == [91.5, 88.0, 0.0, 47.25]
    assert {row["tag"] for row in result["rows"]} == {"sdk"}


def test_the_support_bundle_records_the_slice(tmp_path, monkeypatch):
    from tpu_tools.dump.create import DumpRequest, create_bundle
    from tpu_tools.dump.reader import Bundle

    _, environment = sysroot.tpu_vm(tmp_path / "host", "v6e", worker=2)
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(tmp_path / "host"))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    bundle = create_bundle(DumpRequest(output=tmp_path / "b.tar.gz", only=("accelerators.discovery",)))
    with Bundle(bundle.path) as opened:
        tpu_slice = opened.read_json("accelerators/discovery.json")["tpu_slice"]
    assert (tpu_slice["accelerator_type"], tpu_slice["worker_id"], tpu_slice["gce_vm"]) == ("v6e-16", 2, True)


def test_the_slice_example_in_the_docs_is_what_tpu_ls_prints(tmp_path):
    _, environment = sysroot.tpu_vm(tmp_path, "v5e", worker=0)
    output = run_tool("tpu-ls", "--no-runtime", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), **environment)).stdout
    docs = (TESTS.parent / "docs" / "tpu.md").read_text()
    header = output.splitlines()[0]
    assert header.split("chips found", 1)[1] in docs  # host name and versions differ between machines
    assert output.splitlines()[1] in docs
    assert output.splitlines()[2] in docs


def test_the_metric_query_example_in_the_docs_is_what_tpu_ls_prints():
    docs = (TESTS.parent / "docs" / "tpu.md").read_text()
    block = docs.split("$ tpu-ls --metric hbm_usage --metric host_compute_latency --metrics-addr 127.0.0.1:18431\n",
                       1)[1].split("```", 1)[0]
    with FakeMetricsService(v5p_host()) as service:
        output = run_tool("tpu-ls", "--metric", "hbm_usage", "--metric", "host_compute_latency", "--metrics-addr",
                          service.address).stdout
    # the docs show what a user sees: libtpu's own default address
    assert output.replace(service.address, "127.0.0.1:18431").replace(DEFAULT_METRICS_ADDR, "localhost:8431") == block
