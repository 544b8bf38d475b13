"""tpu-diag's parts without a runtime: parsing, judgement, digests, records, the kept result and its readers."""

from __future__ import annotations

import json
import os
import tarfile
import time

import numpy as np
import pytest
from conftest import as_report, clean_env, run_tool
from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.diag.compare import judge_digests, rate_outliers
from tpu_tools.diag.digest import host_digest
from tpu_tools.diag.junit import junit_xml
from tpu_tools.diag.records import Check, Coverage, DiagReport
from tpu_tools.diag.settings import DiagSettings, Injection, parse_injection, parse_injections
from tpu_tools.errors import UsageError


def test_injection_parses_kind_and_device():
    assert parse_injection("gemm:3") == Injection("gemm", 3)
    assert parse_injection(" Collective:12 ") == Injection("collective", 12)
    for bad in ("gemm", "gemm:", "gemm:-1", "laser:1", ":1", "gemm:1.5", "gemm:99999999999", "kat:\uff11",
                "kat:\u0661", "kat:\u00b2"):
        with pytest.raises(UsageError, match=r"^--inject '.*': (use KIND:DEVICE|DEVICE must be a device id)"):
            parse_injection(bad)


def test_every_injection_given_applies_and_a_kind_twice_is_refused():
    assert parse_injections(["gemm:0", "kat:1"]) == (Injection("gemm", 0), Injection("kat", 1))
    settings = DiagSettings(level=2, inject=parse_injections(["gemm:0", "kat:1"]))
    assert settings.injected("gemm") == Injection("gemm", 0)
    assert settings.injected("kat") == Injection("kat", 1)
    with pytest.raises(UsageError, match="one device per kind"):
        parse_injections(["gemm:0", "gemm:1"])


def test_only_and_skip_name_tests_or_families_of_the_level():
    names = DiagSettings(level=2, only=("gemm f32", "memory"), skip=("memory random",)).selected_tests()
    assert names == ["gemm f32", "gemm f32 exact", "memory address", "memory walking-ones", "memory walking-zeros"]
    assert "memory long checkerboard" in DiagSettings(level=4, only=("memory long",)).selected_tests()
    assert DiagSettings(level=4).selected_tests()[-1] == "sustained"
    for settings, fragment in ((DiagSettings(level=1, only=("gemm",)), "no such test at -r 1"),
                               (DiagSettings(level=2, skip=("gem",)), "no such test"),
                               (DiagSettings(level=1, only=("compile",), skip=("compile",)), "leave no test"),
                               (DiagSettings(level=2, only=("memory",), inject=(Injection("gemm", 0),)),
                                "not selected"),
                               (DiagSettings(level=1, iterations=0), "--iterations")):
        with pytest.raises(UsageError, match=fragment):
            settings.validate()


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "int8"])
def test_the_exact_gemm_inputs_keep_every_partial_sum_exact_in_the_dtype(dtype):
    from tpu_tools.diag.kernels import exact_bound, exact_gemm_inputs

    a, b, want = exact_gemm_inputs(dtype, 512)
    # every term, and so every partial sum in any order, is an integer the dtype (and a bf16 multiply) holds
    exact_integers = {"f32": 1 << 24, "bf16": 256, "f16": 2048, "int8": 1 << 31}[dtype]
    assert exact_bound(dtype, 512) <= exact_integers
    assert np.abs(a.astype(np.int64)).sum(axis=1).max() * np.abs(b.astype(np.int64)).max() <= exact_bound(dtype, 512)
    assert np.abs(a.astype(np.int64)).max() <= (127 if dtype == "int8" else 256)
    np.testing.assert_array_equal(want.astype(np.int64), a.astype(np.int64) @ b.astype(np.int64))
    assert np.count_nonzero(want) > want.size // 4  # the product is not mostly zeros


@given(st.text(max_size=40))
def test_injection_parser_never_fails_otherwise(text):
    try:
        parse_injection(text)
    except UsageError as error:
        assert "\n" not in str(error)


def test_settings_are_checked():
    for settings, fragment in ((DiagSettings(level=5), "1, 2, 3 or 4"), (DiagSettings(memory_fraction=0.0), "above 0"),
                               (DiagSettings(memory_fraction=1.01), "at most 1"),
                               (DiagSettings(level=1, inject=(Injection("memory", 0),)), "from -r 2")):
        with pytest.raises(UsageError, match=fragment):
            settings.validate()
    settings = DiagSettings(level=3, inject=(Injection("sustained", 2), Injection("kat", 0)), duration_s=60.0,
                            only=("sustained", "known-answer"), iterations=3)
    assert DiagSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


def test_the_device_that_repeats_a_wrong_digest_is_the_suspect():
    verdicts = {j.device: (j.status, j.why) for j in judge_digests({0: ["a", "a"], 1: ["a", "a"], 2: ["b", "b"],
                                                                     3: ["a", "c"]})}
    assert verdicts[0][0] == verdicts[1][0] == "pass"
    assert verdicts[2][0] == "fail"
    assert "differs from a" in verdicts[2][1]
    assert verdicts[3][0] == "warn"
    assert "nondeterministic" in verdicts[3][1]
    split = judge_digests({0: ["a", "a"], 1: ["b", "b"]})
    assert all(j.status == "fail" and "no majority" in j.why for j in split)
    assert judge_digests({5: ["a", "a"]})[0].status == "skip"  # repeatable is no proof of the bits


def test_a_device_ten_percent_slower_than_its_peers_is_an_outlier():
    judged = {j.device: j.status for j in rate_outliers({0: 1.0, 1: 1.02, 2: 0.98, 3: 1.12}, 0.10)}
    assert judged == {0: "pass", 1: "pass", 2: "pass", 3: "warn"}
    assert all(j.status == "pass" for j in rate_outliers({0: 1.0, 1: 2.0}, 0.10, judged=False))
    assert rate_outliers({0: 1.0}, 0.10)[0].status == "skip"


@given(st.integers(0, 255), st.integers(0, 31))
def test_any_single_flipped_bit_changes_the_digest(position, bit):
    words = np.random.default_rng(position).integers(0, 1 << 32, 256, dtype=np.uint32)
    flipped = words.copy()
    flipped[position] ^= np.uint32(1 << bit)
    assert host_digest(words) != host_digest(flipped)
    assert host_digest(words) == host_digest(words.copy())


def _report(status: str = "fail") -> DiagReport:
    checks = [Check("compile", "pass", "ok", device=0), Check("gemm f32", status, "digest differs", device=1),
              Check("collective ring +1", "pass", "exact"), Check("memory random", "skip", "out of memory", device=0)]
    coverage = Coverage(links=["0->1"], dtypes=["f32"])
    coverage.device(0).memory_tested_bytes, coverage.device(0).memory_free_bytes = 1 << 20, 1 << 30
    return DiagReport(level=2, time="2026-11-24T10:00:00+00:00", host="vm", platform="tpu", device_kind="TPU v4",
                      device_ids=[0, 1], checks=checks, coverage=coverage)


def test_the_report_round_trips_and_its_status_gives_the_exit_code():
    report = _report()
    document = json.loads(json.dumps(report.to_dict()))
    assert document["schema"] == "tpu-tools/diag/v1"
    assert document["status"] == "fail"
    assert document["exit_code"] == 1
    assert document["counts"] == {"pass": 2, "warn": 0, "fail": 1, "skip": 1}
    assert DiagReport.from_dict(document).to_dict() == document
    assert _report("warn").exit_code == 3
    assert _report("pass").exit_code == 0
    xml = junit_xml(report)
    assert 'tests="4"' in xml
    assert 'errors="1"' in xml
    assert 'skipped="1"' in xml
    assert "digest differs" in xml


@pytest.fixture
def rundir(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(folder))
    return folder


def test_the_last_result_is_kept_and_read_back(rundir):
    from tpu_tools.metrics.diagstate import read_last, write_last

    assert read_last() is None
    write_last(_report().to_dict())
    assert oct(rundir.stat().st_mode & 0o777) == "0o700"
    last = read_last()
    assert last is not None
    assert last.error is None
    assert last.status == "fail"
    assert last.level == 2
    assert last.device_status() == {0: "pass", 1: "fail"}
    assert last.age_s(now=last.time_unix_s + 90) == 90
    assert [c.test for c in last.failed()] == ["gemm f32"]


def test_a_reader_asking_every_round_decodes_the_file_again_only_when_it_changed(rundir):
    from tpu_tools.metrics.diagstate import LastDiagReader, write_last

    reader = LastDiagReader()
    assert reader.read() is None
    write_last(_report("fail").to_dict())
    first = reader.read()
    assert first is not None
    assert first.status == "fail"
    assert reader.read() is first  # unchanged: the record read before, not decoded again
    write_last(_report("pass").to_dict())
    again = reader.read()
    assert again is not None
    assert again is not first
    assert again.status == "pass"
    rundir.chmod(0o777)  # an unsafe directory is said at once, though the file did not change
    unsafe = reader.read()
    assert unsafe is not None
    assert unsafe.error
    rundir.chmod(0o700)
    assert reader.read().status == "pass"
    (rundir / "diag-last.json").unlink()
    assert reader.read() is None


@pytest.mark.parametrize("content", ["not json", '{"schema": "other"}', '[1, 2]',
                                     '{"schema": "tpu-tools/diag/v1", "time": "yesterday"}'])
def test_a_damaged_last_result_is_an_error_not_a_crash(rundir, content):
    from tpu_tools.metrics.diagstate import read_last

    rundir.mkdir(mode=0o700)
    (rundir / "diag-last.json").write_text(content)
    last = read_last()
    assert last is not None
    assert last.error
    assert "diag-last.json" in last.error


def test_a_hostile_last_result_is_cut_or_refused_with_the_field_named(rundir):
    from tpu_tools.metrics.diagstate import read_last

    rundir.mkdir(mode=0o700)
    path = rundir / "diag-last.json"
    head = '{"schema": "tpu-tools/diag/v1", "time": "2026-11-22T19:49:51+00:00", "status": "fail", '
    check = {"test": "t" * 500, "status": "fail", "device": 1, "why": "w" * 5000, "figures": {"digest": "d" * 99}}
    path.write_text(head + '"checks": [' + json.dumps(check) + "]}")
    last = read_last()
    assert last is not None
    assert last.error is None
    (found,) = last.checks
    assert (len(found.test), len(found.why), found.digest) == (80, 300, "d" * 16)  # shown, so cut, not refused
    path.write_text(head + '"checks": [{"test": "gemm", "status": "fail", "device": -1}]}')
    last = read_last()
    assert last is not None
    assert last.error
    assert "$.checks[0].device" in last.error
    assert ">= 0" in last.error
    path.write_text(head + '"extra": ' + "[" * 100_000 + "]" * 100_000 + "}")
    last = read_last()
    assert last is not None
    assert last.error
    assert "nested too deeply" in last.error


def test_monitor_exports_the_verdict_per_test_and_device_and_top_shows_it(rundir):
    from prometheus_client import CollectorRegistry, generate_latest

    from tpu_tools.metrics.diagstate import write_last
    from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
    from tpu_tools.metrics.groups.diag import DiagGroup
    from tpu_tools.metrics.records.devices import DeviceExtra
    from tpu_tools.top.frame import device_lines, diag_cell, frame_text

    document = _report().to_dict()
    document["time"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 7200))
    write_last(document)
    group = DiagGroup(CollectOptions())
    context = CollectContext(CollectOptions(), {"diag": group})
    data = group.collect(context)
    assert data.last is not None
    assert data.last.status == "fail"
    assert data.last.failed_checks == 1
    figures = {f.device_id: f.extra.diag_status for f in group.device_figures(context)}
    assert figures == {0: "pass", 1: "fail"}

    class Families:
        def collect(self):
            return group.prometheus(data)

    registry = CollectorRegistry()
    registry.register(Families())
    text = generate_latest(registry).decode()
    assert 'tpu_tools_diag_check_status{device="1",link="",test="gemm f32"} 1.0' in text
    assert 'tpu_tools_diag_check_status{device="0",link="",test="memory random"} 3.0' in text
    assert "tpu_tools_diag_failed 1.0" in text
    assert "tpu_tools_diag_level 2.0" in text
    age = float(next(line.split()[1] for line in text.splitlines() if line.startswith("tpu_tools_diag_age_seconds")))
    assert 7100 < age < 7300
    assert diag_cell(DeviceExtra(diag_status="fail", diag_age_s=7200)) == ("FAIL 2h", "error")
    report = {"diag": data, "devices": {"devices": [
        {"key": "tpu:1", "platform": "tpu", "id": 1, "name": "TPU v4", "extra": {"diag_status": "fail",
                                                                                 "diag_age_s": 7200}}]}}
    frame = frame_text(device_lines(as_report(report), 160, None))
    assert "diag -r 2 FAIL 2h ago (gemm f32 device 1)" in frame
    assert "DIAG" in frame
    assert "FAIL 2h" in frame


def test_the_support_bundle_includes_the_last_result(tmp_path):
    from tpu_tools.metrics.diagstate import write_last

    rundir = tmp_path / "run"
    write_last(_report().to_dict(), rundir)
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir))
    result = run_tool("tpu-dump", "--only", "accelerators.diag", "-o", str(tmp_path / "b.tar.gz"), env=env)
    assert result.returncode == 0, result.stderr
    with tarfile.open(tmp_path / "b.tar.gz") as bundle:
        names = bundle.getnames()
        text_name = next(n for n in names if n.endswith("accelerators/diag-last.txt"))
        text = bundle.extractfile(text_name).read().decode()  # type: ignore[union-attr]
    assert any(n.endswith("accelerators/diag-last.json") for n in names)
    assert "gemm f32" in text
    assert "verdict: FAIL" in text
    assert os.path.exists(rundir / "diag-last.json")


def test_the_kubernetes_gate_runs_the_quick_level_where_the_exporter_reads_it():
    import kubernetes_validate
    import yaml
    from conftest import REPO

    documents = list(yaml.safe_load_all((REPO / "deploy/kubernetes/optional/diag-gate.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["Job", "Pod"]
    for document in documents:
        kubernetes_validate.validate(document, "1.31.0", strict=True)
    job_pod = documents[0]["spec"]["template"]["spec"]
    gates = [job_pod["containers"][0], documents[1]["spec"]["initContainers"][0]]
    for gate in gates:
        assert gate["command"][:3] == ["tpu-diag", "-r", "1"]
        assert {e["name"]: e["value"] for e in gate["env"]}["TPU_TOOLS_RUNTIME_DIR"] == "/run/tpu-tools"
        assert gate["volumeMounts"][0]["mountPath"] == "/run/tpu-tools"


def test_tpu_sensors_during_sustained_load_warn_on_throttling_and_sick_links(monkeypatch):
    import sys
    import types

    from tpu_tools.diag.telemetry import Telemetry, score_of

    assert score_of("tray1.chip0.ici2: 3") == ("tray1.chip0.ici2", 3.0)
    assert score_of(7) == (None, 7.0)
    assert score_of("n/a") == (None, None)
    assert score_of(True) == (None, None)

    class Metric:
        def __init__(self, values):
            self.values = values

        def data(self):
            return self.values

    served = {"tpu_throttle_score": ["0", "4"], "ici_link_health": ["chip0.ici0: 0", "chip1.ici3: 6"]}
    monitoring = types.SimpleNamespace(get_metric=lambda name: Metric(served[name]))
    libtpu = types.ModuleType("libtpu")
    libtpu.sdk = types.SimpleNamespace(tpumonitoring=monitoring)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "libtpu", libtpu)
    telemetry = Telemetry("tpu")
    telemetry.sample()
    assert telemetry.warnings() == ["throttled: tpu_throttle_score 4 of 10 on chip 1",
                                    "ICI link chip1.ici3 unhealthy: ici_link_health 6 of 10"]
    assert telemetry.figures()["telemetry_source"] == "libtpu.sdk"
    from tpu_tools.render.diag_view import sensor_lines

    report = DiagReport(level=3, time="2026-11-27T10:00:00+00:00", host="vm",
                        checks=[Check("sustained", "warn", "throttled", figures=telemetry.figures())])
    assert sensor_lines(report) == ["sensors (libtpu.sdk): ici_link_health worst 6 of 10 on chip1.ici3; "
                                    "tpu_throttle_score worst 4 of 10 on chip 1"]
    quiet = Telemetry("cpu")
    quiet.sample()
    assert quiet.warnings() == []
    assert quiet.figures()["telemetry_error"] == "no sensor reading on this platform"


SENSORS = r"""
import time
from tpu_tools.diag.records import Check, DiagReport
from tpu_tools.diag.telemetry import SAMPLE_EVERY, Telemetry
from tpu_tools.render.diag_view import sensor_lines

telemetry = Telemetry("cuda")
for reading in range(3):
    for _ in range(SAMPLE_EVERY):
        telemetry.sample()
    time.sleep(0.2)  # the time between two readings is what a throttle reason is counted for
report = DiagReport(level=3, time="2026-11-27T10:00:00+00:00", host="vm", checks=[
    Check("sustained", "warn", "; ".join(telemetry.warnings()), figures=telemetry.figures())])
print("\n".join(sensor_lines(report)))
"""


def test_the_sensors_peaks_and_throttle_times_reach_the_table(tmp_path, fake_nvml_dir):
    import subprocess
    import sys

    import sysroot
    from fakenvml import nvml_env

    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    env = nvml_env(fake_nvml_dir, root, FAKE_NVML_SICK="1")  # GPU 1 runs hot: hw_thermal_slowdown
    result = subprocess.run([sys.executable, "-c", SENSORS], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["sensors GPU 0 (nvml)", "sensors GPU 1 (nvml)"], lines
    assert all(" C, peak " in line and " W, lowest SM clock " in line and " MHz" in line for line in lines)
    assert lines[0].endswith("not throttled")
    seconds = float(lines[1].split("hw_thermal_slowdown ")[1].split(" s")[0])
    assert seconds >= 0.4  # two intervals between three readings
