"""A real Prometheus server on 127.0.0.1 scraping real `tpu-monitor --prometheus` exporters.

Each exporter reads its own fixture host: a sysroot with eight v5e chips held by a process, a fake libtpu
metrics service with that host's duty cycle, and light agent jobs in its own runtime directory. A small
in-process exporter adds the GPU series (synthetic: no GPU here) so GPU rules and panels have data.
Everything binds 127.0.0.1 and `stop()` ends all of it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import sysroot
import yaml
from agentjobs import Job, agent_env, make_rundir, remove_rundir, start_job
from conftest import REPO, tool_command
from libtpu_server import DUTY_CYCLE, FakeMetricsService, gauge, int_attr, v5e_host
from programs import needs

PROMETHEUS = shutil.which("prometheus")
ALERT_RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RECORD_RULES = REPO / "deploy" / "prometheus" / "records.yml"
PROMTOOL = shutil.which("promtool")
needs_prometheus = needs("prometheus")  # skipped where missing, failed in CI (tests/programs.py)
needs_promtool = needs("promtool")


def rules_in(path: Path) -> list[dict]:
    """Every rule of a Prometheus rule file, alerting or recording, in order."""
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def check_and_test_rules(rules: Path, tests: Path) -> tuple[str, str]:
    """promtool's check of a rule file and its unit tests, both passed: (the check's output, the tests')."""
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", tests.name], capture_output=True, text=True, timeout=120,
                            cwd=tests.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    return checked.stdout, tested.stdout


def free_port() -> int:
    """A port that was free a moment ago: only for a program that cannot bind port 0 itself, which must then
    retry on a collision (see FixtureHost.start_exporter), or for an address that must refuse connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class PrometheusServer:
    def __init__(self, workdir: Path, jobs: dict[str, list[str]], rule_files: list[Path] | None = None,
                 interval: str = "1s", extra_config: str = "", agent: bool = False, flags: tuple[str, ...] = ()):
        self.workdir = workdir
        self.agent = agent  # agent mode: scrapes and remote-writes, keeps no TSDB and answers no queries
        self.flags = flags
        self.port = 0  # Prometheus binds port 0 itself; start() reads the port back from its log
        self.process: subprocess.Popen | None = None
        scrape = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
            for job, targets in jobs.items())
        rules = "".join(f"  - {path}\n" for path in rule_files or [])
        self.config = workdir / "prometheus.yml"
        self.config.write_text(f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
                               + (f"rule_files:\n{rules}" if rules else "") + f"scrape_configs:\n{scrape}"
                               + extra_config)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        log_path = self.workdir / "prometheus.log"
        log = open(log_path, "w")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config}",
             *(["--enable-feature=agent", f"--storage.agent.path={self.workdir / 'wal'}"] if self.agent
               else [f"--storage.tsdb.path={self.workdir / 'data'}"]),
             "--web.listen-address=127.0.0.1:0", "--log.level=info", *self.flags],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {log_path.read_text()}")
            if not self.port:
                found = re.search(r'msg="Listening on" address=127\.0\.0\.1:(\d+)', log_path.read_text())
                self.port = int(found.group(1)) if found else 0
            try:
                if self.port and http_get(self.url + "/-/ready", timeout=1):
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"prometheus did not become ready in time: {log_path.read_text()[-2000:]}")

    def query(self, expr: str) -> list[dict]:
        body = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        document = json.loads(body)
        assert document["status"] == "success", document
        return document["data"]["result"]

    def wait_for(self, expr: str, count: int = 1, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.query(expr)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r}: {len(found)} series, wanted {count}")
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def kill(self) -> None:
        """Stop at once: for an agent whose remote-write store is gone, which would spend 20 s trying to flush."""
        if self.running:
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class FixtureHost:
    """One exporter and what it reads: a sysroot, a fake libtpu service, a runtime directory with jobs."""

    name: str
    duty_cycle: list[float]
    root: Path
    port: int = 0  # chosen by start_exporter
    service: FakeMetricsService | None = None
    rundir: Path | None = None
    jobs: list[Job] = field(default_factory=list)
    exporter: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, jobs: int = 1) -> FixtureHost:
        sysroot.v5e_host(self.root, holders={3001: list(range(8))})
        fixture = v5e_host()
        fixture.metrics[DUTY_CYCLE] = [gauge(int_attr("device-id", d), self.duty_cycle[d]) for d in range(8)]
        self.service = FakeMetricsService(fixture).start()
        self.rundir = make_rundir()
        # The first host runs a real JAX job (live arrays, compiles, a recompilation); the others light ones.
        # The JAX job compiles through a persistent compilation cache, for the cache series and panels.
        cache = {"JAX_COMPILATION_CACHE_DIR": str(self.rundir / "jax-cache"),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                 # one job across restarts per host, for the job series and panels
                 "TPU_TOOLS_JOB": f"{self.name}-train", "TPU_TOOLS_JOB_DIR": str(self.rundir / "jobs")}
        self.jobs = [start_job(self.rundir, light=self.name != "a", tag=f"{self.name}-job{i}", lifetime_s=600,
                               extra_env=cache) for i in range(jobs)]
        for job in self.jobs:
            job.wait_ready()
        return self.start_exporter()

    @property
    def exporter_log(self) -> Path:
        return self.root / "exporter.log"

    def start_exporter(self, timeout: float = 60.0) -> FixtureHost:
        """Start the exporter and wait until it serves. tpu-monitor takes a port number, not port 0, so the
        port is picked free and a collision with another program that bound it meanwhile is retried on a
        fresh one; the exporter's stderr is kept for the failure message."""
        for _ in range(5):
            if not self.port:
                self.port = free_port()
            with open(self.exporter_log, "w") as log:
                self.exporter = subprocess.Popen(
                    [*tool_command("tpu-monitor"), "--period", "0.5", "--metrics-timeout", "0.5", "--metrics-addr",
                     self.service.address, "--prometheus", self.target, "--quiet"],
                    env=agent_env(self.rundir, TPU_TOOLS_SYSROOT=str(self.root)), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + timeout
            while self.exporter.poll() is None and time.monotonic() < deadline:
                try:
                    http_get(f"http://{self.target}/metrics", timeout=2)
                    return self
                except OSError:
                    time.sleep(0.1)
            if self.exporter.poll() is None or "already in use" not in self.exporter_log.read_text():
                break
            self.port = 0  # taken by someone else meanwhile: pick another
        self.stop()
        raise AssertionError(f"exporter of host {self.name} did not serve: {self.exporter_log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.exporter is not None and self.exporter.poll() is None:
            self.exporter.terminate()
            try:
                self.exporter.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.exporter.kill()
                self.exporter.wait(timeout=10)
        for job in self.jobs:
            job.stop()
        if self.service is not None:
            self.service.stop()
        if self.rundir is not None:
            remove_rundir(self.rundir)


class SyntheticGpuExporter:
    """The GPU series of one node with two GPUs (one hot and throttling, one with ECC errors)."""

    def __init__(self) -> None:
        import msgspec
        from prometheus_client import CollectorRegistry, start_http_server

        from tpu_tools.metrics.nvml.export import families
        from tpu_tools.metrics.records.gpu import GpusRecord

        def gpu(index: int, **figures: object) -> dict[str, object]:
            return {"index": index, "uuid": f"GPU-{index}", "pci_bus_id": f"0000:0{index}:00.0", "status": "ok",
                    "memory_total_bytes": 80 * 10**9, **figures}

        # The nvml group's own export code, fed the records a hot, throttling GPU and an idle one would give.
        records = msgspec.convert({"gpus": [
            gpu(0, utilization_gpu_percent=93.0, memory_used_bytes=78 * 10**9, temperature_celsius=88.0,
                power_draw_watts=690.0, ecc_aggregate_uncorrected_errors=0,
                clock_event_reasons=["hw_thermal_slowdown"]),
            gpu(1, utilization_gpu_percent=0.0, memory_used_bytes=10**9, temperature_celsius=40.0,
                power_draw_watts=70.0, ecc_aggregate_uncorrected_errors=2, clock_event_reasons=["gpu_idle"]),
        ]}, GpusRecord)

        class Records:
            def collect(self):  # noqa: ANN202 (prometheus_client's collector protocol)
                return families(records)

        self.registry = CollectorRegistry()
        self.registry.register(Records())
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self.server.server_address[1]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# Duty cycles of the three hosts: two busy alike, one slow worker with idle chips still held.
DUTY_CYCLES = {"a": [90.0] * 8, "b": [88.0] * 8, "c": [30.0] * 4 + [0.0] * 4}


class FleetStack:
    def __init__(self, rule_files: list[Path] | None = None):
        self.workdir = Path(tempfile.mkdtemp(prefix="fleet", dir="/tmp"))
        self.hosts = [FixtureHost(name, duty, self.workdir / name) for name, duty in DUTY_CYCLES.items()]
        self.gpu: SyntheticGpuExporter | None = None
        self.prometheus: PrometheusServer | None = None
        self.rule_files = [ALERT_RULES, RECORD_RULES] if rule_files is None else rule_files

    def start(self) -> FleetStack:
        try:
            for host in self.hosts:
                host.start()
            self.gpu = SyntheticGpuExporter()
            self.prometheus = PrometheusServer(self.workdir, {"tpu-tools": [h.target for h in self.hosts],
                                                              "tpu-tools-gpu": [self.gpu.target]},
                                               rule_files=self.rule_files).start()
            self.wait_whole()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_whole(self) -> None:
        """Every host scraped with its chips' duty cycle and its agents, and the GPU node."""
        assert self.prometheus is not None
        try:
            self.prometheus.wait_for('tpu_tools_device_utilization_ratio{job="tpu-tools"}', count=24)
            self.prometheus.wait_for('tpu_tools_process_steps_total{job="tpu-tools"}', count=3)
            self.prometheus.wait_for("tpu_tools_gpu_power_draw_watts", count=2)
            if RECORD_RULES in self.rule_files:  # the second rule group reads the first's records
                self.prometheus.wait_for(
                    "instance:tpu_tools_device_utilization_ratio:distance_from_cluster_median", count=3)
        except AssertionError as error:
            logs = "; ".join(f"{h.name}: {h.exporter_log.read_text()[-1000:]}" for h in self.hosts
                             if h.exporter is not None and h.exporter.poll() is not None)
            raise AssertionError(f"{error}; exporters that exited: {logs or 'none'}") from error

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.gpu is not None:
            self.gpu.stop()
        for host in self.hosts:
            host.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
