"""The fleet view against a real Prometheus scraping three real exporters, and its faults."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, as_report, assert_one_line_error, clean_env, report_document, run_tool, tool_command
from programs import needs, require_program
from promstack import FleetStack, free_port, http_get
from test_top import Tmux

from tpu_tools.errors import RuntimeFailure, UsageError
from tpu_tools.metrics.fleet.client import Sample, parse_url
from tpu_tools.metrics.fleet.outliers import furthest
from tpu_tools.metrics.fleet.records import build_groups
from tpu_tools.metrics.fleet.source import FleetSource
from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.model import ViewState

# One Prometheus and three exporters serve this module's tests: in a parallel run they stay on one worker.
pytestmark = pytest.mark.xdist_group("fleet")


@pytest.fixture(scope="module")
def stack() -> Iterator[FleetStack]:
    require_program("prometheus")
    fleet = FleetStack().start()
    yield fleet
    fleet.stop()


# --- against the real stack --------------------------------------------------------------------------------

def test_fleet_report_has_every_host_chip_and_job_and_the_slow_worker(stack):
    report = report_document(FleetSource(stack.prometheus.url, 5.0).build())
    targets = sorted(h.target for h in stack.hosts)
    fleet = report["fleet"]
    assert fleet["error"] is None
    assert fleet["stale"] is False
    assert [h["host"] for h in fleet["hosts"]] == targets
    assert all(h["up"] and h["chips"] == 8 and h["jobs"] == 1 for h in fleet["hosts"])
    by_host = {h["host"]: h for h in fleet["hosts"]}
    assert by_host[stack.hosts[0].target]["utilization_percent"] == pytest.approx(90.0)
    assert by_host[stack.hosts[2].target]["utilization_percent"] == pytest.approx(15.0)
    assert fleet["median_utilization_percent"] == pytest.approx(88.0)
    outliers = {o["figure"]: o["host"] for o in fleet["outliers"]}
    assert outliers["utilization_percent"] == stack.hosts[2].target
    # The JAX job's steps take a millisecond, the light jobs' 50 ms: the first host stands out in step time.
    assert outliers["step_time_s"] == stack.hosts[0].target
    assert "utilization 15.0 % vs median 88.0 %" in by_host[stack.hosts[2].target]["outlier"]
    devices = report["devices"]["devices"]
    assert len([d for d in devices if "@" not in d["key"]]) == 24  # and the JAX job's own CPU device
    assert {d["key"] for d in devices} >= {f"{t}/tpu:{i}" for t in targets for i in range(8)}
    first = next(d for d in devices if d["key"] == f"{stack.hosts[0].target}/tpu:3")
    assert first["memory_total_bytes"] == 16 << 30
    assert first["holder_processes"] == 1
    agents = report["processes"]["agents"]
    assert sorted(a["tag"] for a in agents) == ["a-job0", "b-job0", "c-job0"]
    assert all(a["steps"]["count"] > 0 and a["host"] in targets for a in agents)
    # each host's job across restarts (tests/promstack.py), named by its process and with its figures
    assert sorted(a["job"]["id"] for a in agents) == ["a-train", "b-train", "c-train"]
    jobs = {job["job"]: job for job in report["processes"]["jobs"]}
    assert sorted(jobs) == ["a-train", "b-train", "c-train"]
    assert jobs["a-train"]["hosts"] == [stack.hosts[0].target]
    assert jobs["a-train"]["goodput"]["disruptions"] == 0
    assert jobs["a-train"]["goodput"]["lost_progress_s"] == 0
    assert 0 <= jobs["a-train"]["goodput"]["goodput_percent"] <= 100
    answered = [s["address"] for s in report["libtpu"]["services"] if s["error"] is None]
    assert answered == [f"{h.target}/{h.service.address}" for h in sorted(stack.hosts, key=lambda h: h.target)]
    assert all(s["error"] == "not answering" for s in report["libtpu"]["services"] if "8431" in s["address"])


def test_top_once_shows_hosts_outlier_first_with_the_host_column(stack):
    result = run_tool("tpu-top", "--from-prometheus", stack.prometheus.url, "--once", env=clean_env(COLUMNS="160"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    hosts = lines.index(next(line for line in lines if line.startswith(" Hosts")))
    assert "3 from " + stack.prometheus.url in lines[hosts]
    assert "median util 88.0%" in lines[hosts]
    rows = lines[hosts + 2:hosts + 5]
    slow = next(row for row in rows if row.split()[0] == stack.hosts[2].target)
    assert "<< utilization 15.0 % vs median 88.0 %" in slow
    # outliers first: on a loaded machine a host's step time may be flagged too, so no row without << precedes
    # the slow worker's
    assert all("<<" in row for row in rows[:rows.index(slow)])
    assert f"{stack.hosts[0].target}/tpu:0" in result.stdout
    header = next(line for line in lines if "STEP/S" in line and "PID" in line)
    assert header.split()[0] == "HOST"
    assert any(line.split()[:1] == [stack.hosts[1].target] and "b-job0" in line for line in lines)


def test_monitor_from_prometheus_writes_fleet_reports(stack):
    result = run_tool("tpu-monitor", "--from-prometheus", stack.prometheus.url, "--count", "2", "--period", "0.2")
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["sequence"] for r in reports] == [0, 1]
    assert all(r["schema"] == "tpu-tools/monitor/v1" and len(r["fleet"]["hosts"]) == 3 for r in reports)


def test_alert_rules_load_and_evaluate_on_the_scraped_data(stack):
    rules = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        groups = json.loads(http_get(stack.prometheus.url + "/api/v1/rules"))["data"]["groups"]
        every = [rule for group in groups for rule in group["rules"]]
        rules = {rule["name"]: rule for rule in every if rule["type"] == "alerting"}  # records.yml's too
        if rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules.values()):
            break
        time.sleep(0.2)
    assert len(rules) == 20, every
    assert {r["health"] for r in every} == {"ok"}, every
    matched = {name: stack.prometheus.query(rule["query"]) for name, rule in rules.items()}
    slow = stack.hosts[2].target
    assert sorted((s["metric"]["instance"], s["metric"]["device"]) for s in matched["TpuToolsDeviceIdleWhileHeld"]) \
        == [(slow, f"tpu:{i}") for i in range(4, 8)]
    assert [s["metric"]["reason"] for s in matched["TpuToolsGpuThrottling"]] == ["hw_thermal_slowdown"]
    # The GPU node's exporter serves its GPU series only (its memory would be the devices group's series).
    quiet = {"TpuToolsRecompilationStorm", "TpuToolsExporterDown", "TpuToolsAgentDown", "TpuToolsGpuLost",
             "TpuToolsLibtpuMetricsUnreachable", "TpuToolsDeviceMemoryAlmostFull", "TpuToolsGpuMemoryAlmostFull",
             "TpuToolsGpuXidError", "TpuToolsGpuPcieLinkDegraded", "TpuToolsGpuNvlinkDown",
             "TpuToolsGlobalMetricDiffers", "TpuToolsCpuFallbacks"}
    assert all(matched[name] == [] for name in quiet), {name: matched[name] for name in quiet}


def test_every_dashboard_panel_query_returns_data(stack):
    dashboards = sorted((REPO / "deploy" / "grafana").glob("*.json"))
    assert len(dashboards) == 3
    queried = 0
    for path in dashboards:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets") or []:
                # What Grafana sends for "All" hosts and for the rate window.
                expr = target["expr"].replace("$instance", ".*").replace("$cluster", ".*")
                expr = expr.replace("$__rate_interval", "30s")
                # A rate() needs two samples in its window, so a young stack may answer nothing yet: wait for
                # the data each query needs, with a deadline.
                try:
                    stack.prometheus.wait_for(expr, timeout=60)
                except AssertionError as error:
                    pytest.fail(f"{path.name}, panel {panel['title']!r}: {error}")
                queried += 1
    assert queried >= 23


def test_a_host_whose_exporter_goes_away_is_shown_down(stack):
    gone = stack.hosts[1]
    gone.exporter.terminate()
    gone.exporter.wait(timeout=20)
    try:
        stack.prometheus.wait_for(f'up{{instance="{gone.target}"}} == 0', timeout=30)
        report = report_document(FleetSource(stack.prometheus.url, 5.0).build())
        assert report["fleet"]["hosts_down"] == [gone.target]
        assert {h["host"]: h["up"] for h in report["fleet"]["hosts"]}[gone.target] is False
        assert len([d for d in report["devices"]["devices"] if "@" not in d["key"]]) == 16
    finally:
        # The stack is shared by the module's tests, in any order: bring the host back as it was.
        gone.start_exporter()
        stack.prometheus.wait_for(f'up{{instance="{gone.target}"}} == 1', timeout=30)
        stack.wait_whole()


def test_the_host_whose_diag_digest_differs_from_the_fleets_is_named(stack, tmp_path):
    import yaml

    from tpu_tools.metrics.diagstate import last_path, write_last

    # One real run gives a real key and digest; the other hosts keep the same document, and host c's device
    # computes another digest under the same key (as a host whose devices share a defect would).
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    result = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "1", "--only", "gemm f32",
                      "--skip", "gemm f32 exact", "--json", env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(run)))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    good = next(c["figures"]["digest"] for c in document["checks"] if c["test"] == "gemm f32")
    bad = f"{int(good, 16) ^ 1:016x}"
    odd = stack.hosts[2]
    try:
        for host in stack.hosts:
            copy = json.loads(json.dumps(document))
            for check in copy["checks"]:
                if host is odd and check["test"] == "gemm f32":
                    check["figures"]["digest"] = bad
            write_last({**copy, "last_complete_time": copy["time"]}, host.rundir)
        stack.prometheus.wait_for("tpu_tools_diag_digest_info", count=3)
        rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
        rule = next(r for g in rules for r in g["rules"] if r.get("alert") == "TpuToolsDiagDigestDiffers")
        fired = stack.prometheus.wait_for(rule["expr"])
        assert [(s["metric"]["instance"], s["metric"]["digest"]) for s in fired] == [(odd.target, bad)]
        fleet = report_document(FleetSource(stack.prometheus.url, 5.0).build())["fleet"]
        assert [(o["host"], o["test"], o["agreeing"], o["hosts"]) for o in fleet["digest_outliers"]] == [
            (odd.target, "gemm f32", 1, 3)]
        assert f"gemm f32 digest {bad} differs from 2 of 3 hosts" in {h["host"]: h for h in fleet["hosts"]}[
            odd.target]["outlier"]
        top = run_tool("tpu-top", "--from-prometheus", stack.prometheus.url, "--once",
                       env=clean_env(COLUMNS="200"))
        assert top.returncode == 0, top.stderr
        assert f"diag digest differs on {odd.target}" in top.stdout
    finally:
        for host in stack.hosts:  # the stack is shared by the module's tests: as it was
            last_path(host.rundir).unlink(missing_ok=True)


# --- records and outliers without a server -----------------------------------------------------------------

def _series(instance: str, name: str, value: float, **labels: str) -> Sample:
    return Sample({"__name__": f"tpu_tools_{name}", "instance": instance, "job": "tpu-tools", **labels}, value)


def test_step_time_outlier_and_too_few_hosts():
    assert furthest({"a": 10.0, "b": 90.0}, "utilization_percent") is None  # two hosts: no median to judge by
    assert furthest({"a": 0.10, "b": 0.101, "c": 0.104}, "step_time_s") is None  # 4 % off: normal spread
    slow = furthest({"a": 0.10, "b": 0.101, "c": 0.15, "d": 0.099}, "step_time_s")
    assert slow is not None
    assert slow.host == "c"
    assert slow.sentence == "step time 150.0 ms vs median 100.5 ms"
    series = [_series(h, "process_step_time_seconds", t, pid="7", tag="t", stat="p50")
              for h, t in (("a", 0.1), ("b", 0.1), ("c", 0.3))]
    groups = build_groups(series, [])
    assert [o.host for o in groups["fleet"].outliers] == ["c"]
    assert groups["fleet"].median_step_time_s == pytest.approx(0.1)


def test_a_digest_held_by_fewer_than_half_the_hosts_of_its_key_names_the_host():
    def digest(host: str, value: str, key: str = "k1", test: str = "gemm f32") -> Sample:
        return _series(host, "diag_digest_info", 1.0, test=test, device="0", key=key, digest=value)

    series = [digest("a", "aa"), digest("b", "aa"), digest("c", "cc"), digest("d", "dd", key="k2"),
              digest("a", "x", test="gemm bf16"), digest("b", "y", test="gemm bf16")]  # two: no majority
    fleet = build_groups(series, [])["fleet"]
    assert [(o.host, o.test, o.key, o.agreeing, o.hosts) for o in fleet.digest_outliers] == [
        ("c", "gemm f32", "k1", 1, 3)]
    assert {h.host: h.outlier for h in fleet.hosts}["c"] == "gemm f32 digest cc differs from 2 of 3 hosts"


def test_unknown_series_make_no_host_and_a_bad_url_is_a_usage_error():
    groups = build_groups([_series("x", "future_thing", 1.0)], [])
    assert groups["fleet"].hosts == []
    for bad in ("prometheus:9090", "ftp://host/", "http://", "http://host:99999"):
        with pytest.raises(UsageError, match=r"^--from-prometheus '.*': (expected an http:// or https:// URL|Port out "
                                             r"of range)"):
            parse_url(bad)
    endpoint = parse_url("https://me:s%40cret@prom.example:9090/sub/")
    assert endpoint.base_url == "https://prom.example:9090/sub"
    assert endpoint.authorization == "Basic bWU6c0BjcmV0"


# --- a Prometheus that is down, slow, answers garbage or wants credentials ---------------------------------

@contextmanager
def _server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _handler(status: int, body: bytes, delay_s: float = 0.0) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            time.sleep(delay_s)
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="prometheus"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    return Handler


GOOD = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "tpu_tools_device_utilization_ratio", "instance": "h1", "job": "j",
                "device": "tpu:0", "platform": "tpu", "name": "TPU v5e"}, "value": [0, "0.555"]}]}}).encode()


@pytest.mark.parametrize(("handler", "fragment"), [
    (_handler(200, b"<html>not prometheus</html>"), "did not answer with its HTTP API (not JSON)"),
    (_handler(401, b"Unauthorized"), "authentication needed: give user:password@ in the URL"),
    (_handler(503, json.dumps({"status": "error", "error": "overloaded"}).encode()), "answered HTTP 503: overloaded"),
    (_handler(200, GOOD, delay_s=3.0), "did not answer within 0.5 s"),
], ids=["garbage", "auth", "http-error", "slow"])
def test_each_fault_is_one_clear_line(handler, fragment):
    with _server(handler) as url:
        result = run_tool("tpu-monitor", "--from-prometheus", url, "--from-prometheus-timeout", "0.5", "--count", "1",
                          timeout=60)  # the hang guard
        assert result.returncode == 0, result.stderr  # a report is still written, saying why it is empty
        fleet = json.loads(result.stdout)["fleet"]
        assert fragment in fleet["error"]
        assert fleet["stale"] is True
        assert result.stderr.count("\n") == 1
        assert fragment in result.stderr  # one clear line
        # tpu-top --once has nothing to show: the same sentence, exit 1.
        assert_one_line_error(run_tool("tpu-top", "--from-prometheus", url, "--from-prometheus-timeout", "0.5",
                                       "--once"), 1, fragment)


def test_down_server_keeps_the_last_figures_marked_stale():
    with _server(_handler(200, GOOD)) as url:
        source = FleetSource(url, 1.0)
        first = report_document(source.build())
        assert first["devices"]["devices"][0]["utilization_percent"] == 55.5
    report = report_document(source.build())  # the server is gone
    assert report["fleet"]["stale"] is True
    assert "connection refused" in report["fleet"]["error"]
    assert report["devices"]["devices"][0]["utilization_percent"] == 55.5
    assert report["sequence"] == 1
    lines = frame_text(render(as_report(report), ViewState(), 300, None, interactive=False))
    assert "STALE since" in lines
    assert "connection refused" in lines
    assert "55.5" in lines
    assert report_document(source.build())["fleet"]["stale_since"] == report["fleet"]["stale_since"]


def test_usage_errors():
    url = f"http://127.0.0.1:{free_port()}"
    assert_one_line_error(run_tool("tpu-monitor", "--from-prometheus", "nonsense", "--count", "1"), 2,
                          "--from-prometheus 'nonsense': expected an http:// or https:// URL")
    assert_one_line_error(run_tool("tpu-monitor", "--from-prometheus", url, "--prometheus", "9100"), 2,
                          "--prometheus only apply to this host")
    assert_one_line_error(run_tool("tpu-top", "--from-prometheus", "ftp://x", "--once"), 2, "expected an http://")


def test_client_failure_is_a_runtime_failure():
    source = FleetSource(f"http://127.0.0.1:{free_port()}", 0.5)
    with pytest.raises(RuntimeFailure, match="connection refused"):
        source.api.query("up")


# --- the live view in a real terminal ------------------------------------------------------------------------

@needs("tmux")
def test_live_view_keeps_its_figures_marked_stale_when_prometheus_goes_away():
    bin_dir = str(Path(tool_command("tpu-top")[0]).parent)
    tmux = Tmux(200, 30, clean_env(TERM="xterm-256color", PATH=bin_dir + os.pathsep + os.environ.get("PATH", "")))
    try:
        with _server(_handler(200, GOOD)) as url:
            tmux.keys(f"tpu-top --from-prometheus {url} --interval 0.3", "Enter")
            screen = tmux.wait_for(lambda s: "h1/tpu:0" in s and "55.5" in s)
            assert " Hosts  1 from " + url in screen
            assert "STALE" not in screen
            tmux.keys("s")  # the usual keys: sort by the next column
            tmux.wait_for(lambda s: "sorted by COMP" in s)
        # the figures kept are in the rows under the stale line: the wait names them (a capture can land
        # while a frame is still being painted)
        screen = tmux.wait_for(lambda s: "STALE since" in s and "h1/tpu:0" in s and "55.5" in s)
        stale = next(line for line in screen.splitlines() if "STALE since" in line)
        assert f"Prometheus at {url}" in stale, screen
        tmux.keys("q")
        tmux.wait_for(lambda s: "Hosts" not in s)
    finally:
        tmux.kill()
