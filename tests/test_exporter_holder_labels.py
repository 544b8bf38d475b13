"""Device and GPU series tied to their holder: tag, pod and Slurm job labels; hostile values bounded."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sysroot
from agentjobs import rundir  # noqa: F401 (rundir is a fixture)
from conftest import TESTS, as_report
from fakenvml import nvml_env
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from promstack import PROMTOOL, needs_promtool

from tpu_tools.exporter.holders import device_holders
from tpu_tools.exporter.prometheus import ReportCollector, device_metrics, process_metrics
from tpu_tools.metrics.labeltext import MAX_LABEL_VALUE, label_value
from tpu_tools.metrics.nvml.export import families as gpu_families
from tpu_tools.metrics.slurm import job_id

POD = {"namespace": "ml", "pod": "train-0", "container": "trainer"}


def _report(tag: str = "train", pod: dict | None = None) -> dict:
    device = {"key": "tpu:0", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": 1, "holders": [{"pid": 20}],
              "processes": [{"pid": 10, "tag": tag}]}
    idle = {"key": "tpu:1", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": 2, "holders": [],
            "processes": []}
    gpu = {"index": 0, "uuid": "GPU-0", "pci_bus_id": "0000:18:00.0", "device_key": "gpu:0", "status": "ok",
           "temperature_celsius": 50, "processes": [{"pid": 20, "kind": "compute", "gpu_memory_bytes": 5, "tag": None}]}
    return {"devices": {"error": None, "devices": [device, idle]},
            "processes": {"error": None,
                          "agents": [{"pid": 10, "tag": tag, "kubernetes": pod or POD, "slurm_job_id": None}],
                          "holders": [{"pid": 20, "kubernetes": None, "slurm_job_id": "4242"}]},
            "nvml": {"error": None, "gpus": [gpu]}}


def _exposition(report: dict) -> str:
    collector = ReportCollector({"devices": device_metrics, "processes": process_metrics, "nvml": gpu_families})
    collector.update(as_report(report))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_each_label_from_the_first_holder_that_has_it():
    holders = device_holders(as_report(_report()))
    assert holders["tpu:0"] == {"tag": "train", **POD, "slurm_job_id": "4242"}
    assert holders["gpu:0"] == {"slurm_job_id": "4242"}
    assert "tpu:1" not in holders  # nobody holds it


def test_device_and_gpu_series_carry_their_holder_and_process_series_keep_their_own():
    samples = [s for f in text_string_to_metric_families(_exposition(_report())) for s in f.samples]
    used = [s for s in samples if s.name == "tpu_tools_device_memory_used_bytes"]
    held = next(s for s in used if s.labels["device"] == "tpu:0")
    assert {k: held.labels[k] for k in ("tag", "namespace", "pod", "container", "slurm_job_id")} == {
        "tag": "train", **POD, "slurm_job_id": "4242"}
    assert "tag" not in next(s for s in used if s.labels["device"] == "tpu:1").labels
    temperature = next(s for s in samples if s.name == "tpu_tools_gpu_temperature_celsius")
    assert temperature.labels["slurm_job_id"] == "4242"
    assert temperature.labels["device"] == "gpu:0"
    process = next(s for s in samples if s.name == "tpu_tools_gpu_process_memory_used_bytes")
    assert process.labels["pid"] == "20"
    assert "slurm_job_id" not in process.labels


@needs_promtool
def test_hostile_label_values_are_bounded_and_the_scrape_still_passes_promtool():
    hostile = "a\x1b[2J\"quoted\"\nnew\\line" + "x" * 10_240
    text = _exposition(_report(tag=hostile, pod={"namespace": "\x00ns", "pod": "p" * 10_000, "container": "c"}))
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "\x1b" not in text
    assert "\x00" not in text
    assert max(len(line) for line in text.splitlines()) < 2000
    tags = {s.labels.get("tag") for f in text_string_to_metric_families(text) for s in f.samples} - {None, ""}
    assert tags == {label_value(hostile)}
    assert len(label_value(hostile)) == MAX_LABEL_VALUE


@given(st.text(st.characters(codec=None), max_size=300))
def test_any_label_value_becomes_printable_bounded_utf8(text):
    value = label_value(text)
    assert len(value) <= MAX_LABEL_VALUE
    assert len(value.encode("utf-8")) <= 4 * MAX_LABEL_VALUE
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value)


def test_slurm_job_id_from_the_environment_only_when_it_is_one(tmp_path):
    host = sysroot.HostBuilder(tmp_path)
    for pid, environ in [(1, {"SLURM_JOB_ID": "4242", "PATH": "/bin"}), (2, {"SLURM_JOB_ID": "77_3"}),
                         (3, {"SLURM_JOB_ID": "1; rm -rf /"}), (4, {"HOME": "/root"}),
                         (5, {"A": "x" * (2 << 20), "SLURM_JOB_ID": "9"})]:
        host.process(sysroot.FakeProcess(pid, 0, ["python"], environ=environ))
    assert [job_id(pid, tmp_path) for pid in range(1, 7)] == ["4242", "77_3", None, None, None, None]


def test_the_exporter_labels_a_gpu_with_the_slurm_job_of_the_process_on_it(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root).process(sysroot.FakeProcess(4574, 1000, ["python3", "train.py"], [],
                                                          environ={"SLURM_JOB_ID": "31337"}))
    env = nvml_env(fake_nvml_dir, root, FAKE_NVML_PROCS="0:4574:12190000000", TPU_TOOLS_RUNTIME_DIR=str(rundir))
    result = subprocess.run([sys.executable, str(TESTS / "exposition_once.py")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    held = [s for f in text_string_to_metric_families(result.stdout) for s in f.samples
            if s.labels.get("slurm_job_id") == "31337"]
    names = {s.name for s in held}
    assert {"tpu_tools_gpu_temperature_celsius", "tpu_tools_device_memory_used_bytes"} <= names
    assert {s.labels["device"] for s in held} == {"gpu:0"}


@pytest.mark.parametrize("value", ["train", "ml-pod-0"])
def test_plain_values_are_kept(value):
    assert label_value(value) == value
