"""libtpu's own SDK as the oracle: every fixture service read by the SDK and by tpu-tools, figure by figure.

The SDK (libtpu 0.0.51, installed by tools/test.sh into .libtpu/) runs in children in network namespaces of
their own (tests/libtpu_sdk.py). Gauges must be equal; distributions must agree within 0.5 % by the same
estimator where the distribution has no min/max, and equal the SDK's figure clamped into [min, max] where it
has them; `tpu-ls --runtime-status` must name the same cores, states and programs as
`libtpu.sdk.tpuz.get_core_state_summary()`.
"""

from __future__ import annotations

import json
import math
from functools import cache

import libtpu_sdk
import pytest
import sysroot
from conftest import clean_env, run_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libtpu_sdk import DISTRIBUTIONS, FIGURES, GAUGES, row
from libtpu_server import (
    FIXTURES,
    HBM_UTILIZATION,
    HLO_EXECUTION_TIMING,
    HOSTILE_FIXTURES,
    TENSORCORE_IDLE,
    FakeMetricsService,
    HostFixture,
    exponential_layout,
    ordinal,
    pb,
)

from tpu_tools.metrics.libtpu import read_once
from tpu_tools.metrics.libtpu.distribution import DistributionSummary


@pytest.fixture(autouse=True)
def _sdk_installed() -> None:
    libtpu_sdk.require()

@cache
def sdk(name: str) -> libtpu_sdk.SdkReading:
    """One child (unless a read aborts it) reads every metric and the runtime status of one fixture."""
    return libtpu_sdk.read_fixture(FIXTURES[name](), GAUGES + list(DISTRIBUTIONS), runtime_status=True)


@cache
def ours(name: str) -> tuple[dict, dict | None]:
    return libtpu_sdk.read_ours(FIXTURES[name]())


def close(value: float | None, expected: float) -> bool:
    """Within 0.5 % (and the SDK's two printed decimals)."""
    return value is not None and abs(value - expected) <= max(0.005 * abs(expected), 0.006)


def expected_figures(sdk_numbers: list[float], point: pb.Metric) -> dict[str, float]:
    """The SDK's figures as tpu-tools must show them: clamped into [min, max] where the point has them."""
    data = point.distribution
    figures = dict(zip(FIGURES, sdk_numbers, strict=True))
    if data.min or data.max:
        figures.update({k: min(max(v, data.min), data.max) for k, v in figures.items() if k != "mean"})
    return figures


def assert_figures(summary: dict | DistributionSummary, expected: dict[str, float], what: str) -> None:
    got = summary.to_dict() if isinstance(summary, DistributionSummary) else summary
    wrong = {k: (got[k], v) for k, v in expected.items() if not close(got[k], v)}
    assert not wrong, (what, wrong)


# --- 1. no fixture makes libtpu's own client abort, and it reads every distribution with samples --------------

@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_sdk_reads_every_fixture_without_aborting(name):
    reading = sdk(name)
    assert reading.aborted == {}, reading.log[-3000:]
    fixture = FIXTURES[name]()
    for sdk_name, served in DISTRIBUTIONS.items():
        with_samples = [p for p in fixture.metrics.get(served, []) if p.distribution.count > 0]
        assert len(reading.metrics[sdk_name]) == len(with_samples), (sdk_name, reading.metrics[sdk_name])


def test_the_odd_shapes_abort_or_escape_the_sdk_but_the_tpu_tools_client_reads_what_it_can():
    """Trimmed bucket counts abort libtpu's client; linear and explicit layouts come back empty from it."""
    fixture = HOSTILE_FIXTURES["odd-shapes"]()
    reading = libtpu_sdk.read_fixture(fixture, ["hlo_execution_timing", "host_to_device_transfer_latency",
                                                "collective_e2e_latency", "tcp_delivery_rate"])
    assert "signal 6" in reading.aborted["hlo_execution_timing"]
    assert reading.metrics == {"host_to_device_transfer_latency": [], "collective_e2e_latency": [],
                               "tcp_delivery_rate": []}
    with FakeMetricsService(fixture) as service:
        snapshot = read_once([service.address])[0][0]
    assert snapshot.ok
    assert [d.hlo_execution_time_us.count for d in snapshot.devices] == [200, 200]
    assert all(d.hlo_execution_time_us.p50 for d in snapshot.devices)
    latencies = {t.name: t.latency_us for t in snapshot.transfer_latencies}
    assert latencies["host_to_device_transfer_latencies"].p90
    assert latencies["collective_end_to_end_latencies"].p90
    assert snapshot.delivery_rates[0].rate_mbps.p50


# --- 2. the same figures for the same served data ----------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_gauges_equal_the_sdks(name):
    reading, (snapshot, _) = sdk(name), ours(name)
    devices = {d["device_id"]: d for d in snapshot["devices"]}
    for sdk_name, field in (("hbm_capacity_total", "hbm_total_bytes"), ("hbm_capacity_usage", "hbm_used_bytes")):
        assert [int(v) for v in reading.metrics[sdk_name]] == [devices[i][field] for i in range(len(devices))]
    for text in reading.metrics["hlo_queue_size"]:
        device, _, size = text.partition("-tensor_core:")
        assert devices[int(device)]["hlo_queue_size"] == int(size), text
    served = FIXTURES[name]().metrics
    for sdk_name, field, metric in (("runtime_hbm_utilization", "hbm_bandwidth_utilization_percent", HBM_UTILIZATION),
                                    ("idle_duration", "tensorcore_idle_duration_s", TENSORCORE_IDLE)):
        values = [float(v) for v in reading.metrics[sdk_name]]
        assert len(values) == (len(devices) if metric in served else 0), (sdk_name, values)
        assert all(close(devices[i][field], v) for i, v in enumerate(values)), (sdk_name, values)
    duty = [float(v) for v in reading.metrics["duty_cycle_pct"]]
    usable = [v for v in duty if math.isfinite(v) and 0 <= v <= 100]
    if snapshot["duty_cycle_scope"] == "device":
        # a NaN or 150 % the SDK prints as it came is no figure in tpu-tools: reported, not shown
        assert [d["duty_cycle_percent"] for d in snapshot["devices"]] == [
            v if math.isfinite(v) and 0 <= v <= 100 else None for v in duty]
        assert len(usable) < len(duty) or not any("duty" in n for n in snapshot["notes"])
    else:  # one value per chip, spread over its devices
        assert {d["duty_cycle_percent"] for d in snapshot["devices"]} == set(usable)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_distribution_figures_equal_the_sdks_clamped_into_min_and_max(name):
    reading, (snapshot, _) = sdk(name), ours(name)
    fixture = FIXTURES[name]()
    devices = {d["device_id"]: d for d in snapshot["devices"]}
    compared = 0
    for text in reading.metrics["hlo_execution_timing"]:
        label, numbers = row(text)
        device = int(str(label).removesuffix("-tensor_core"))
        point = next(p for p in fixture.metrics[HLO_EXECUTION_TIMING] if _ordinal(p) == device)
        assert_figures(devices[device]["hlo_execution_time_us"], expected_figures(numbers, point), text)
        compared += 1
    groups = {(g["metric"], g.get("buffer_size", g.get("label"))): g.get("latency_us", g.get("rate_mbps"))
              for g in snapshot["transfer_latencies"] + snapshot["delivery_rates"]}
    for sdk_name, served in DISTRIBUTIONS.items():
        if sdk_name == "hlo_execution_timing":
            continue
        points = [p for p in fixture.metrics.get(served, []) if p.distribution.count > 0]
        for text, point in zip(reading.metrics[sdk_name], points, strict=True):
            label, numbers = row(text)
            same_label = [p for p in points if _label(p) == _label(point)]
            if len(same_label) > 1:
                continue  # tpu-tools merges the data points of one size (several slices); the SDK lists each
            assert_figures(groups[(served, label or "all")], expected_figures(numbers, point), f"{sdk_name} {text}")
            compared += 1
    assert compared >= (1 if fixture.metrics.get(HLO_EXECUTION_TIMING) else 0)


def _ordinal(point: pb.Metric) -> int:
    for attribute in point.attribute.value.kvlist_attr.attributes:
        if attribute.key == "device_ordinal":
            return int(attribute.value.string_attr or attribute.value.int_attr)
    raise AssertionError("no device_ordinal")


def _label(point: pb.Metric) -> str:
    return next((a.value.string_attr for a in point.attribute.value.kvlist_attr.attributes), "all")


# Histograms in an exponential layout, samples only in the buckets libtpu's estimator walks (it leaves the last
# finite bucket and the overflow out) and in at least one bucket above the underflow. Without min/max (proto3's
# 0.0) tpu-tools' figures are the SDK's; with a min and a max inside the first and last occupied buckets they
# are the SDK's clamped into [min, max].
@st.composite
def histograms(draw: st.DrawFn) -> pb.Distribution:
    finite = draw(st.integers(2, 36))
    growth, scale = draw(st.sampled_from([1.1, 1.25, 1.5, 2.0, 3.0, 4.0])), draw(st.sampled_from([0.5, 1.0, 10.0]))
    walked = draw(st.lists(st.integers(0, 400), min_size=finite, max_size=finite).filter(lambda c: sum(c[1:]) > 0))
    counts = walked + [0, 0]
    data = pb.Distribution(count=sum(counts), mean=draw(st.floats(1.0, 1e5)),
                           bucket_options=exponential_layout(finite, growth, scale), bucket_counts=counts)
    if draw(st.booleans()):
        occupied = [i for i, c in enumerate(counts) if c]

        def inside(bucket: int, fraction: float) -> float:
            lower = scale * growth ** (bucket - 1)  # bucket 0 starts at scale / growth, as libtpu takes it
            return lower + (scale * growth ** bucket - lower) * fraction

        first, last = draw(st.floats(0, 0.99)), draw(st.floats(0, 0.99))
        low, high = sorted((inside(occupied[0], first), inside(occupied[-1], last)))
        data.min, data.max = low, high
    return data


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(histograms(), min_size=16, max_size=16))
def test_generated_distributions_give_the_sdks_figures_within_half_a_percent(drawn):
    points = [pb.Metric(attribute=ordinal(i), distribution=data) for i, data in enumerate(drawn)]
    fixture = HostFixture("generated", {HLO_EXECUTION_TIMING: points}, devices=len(points))
    reading = libtpu_sdk.read_fixture(fixture, ["hlo_execution_timing"])
    assert reading.aborted == {}
    with FakeMetricsService(fixture) as service:
        snapshot = read_once([service.address])[0][0]
    rows = dict(row(text) for text in reading.metrics["hlo_execution_timing"])
    assert len(rows) == len(points)
    for device in snapshot.devices:
        numbers = rows[f"{device.device_id}-tensor_core"]
        assert device.hlo_execution_time_us is not None
        expected = expected_figures(numbers, points[device.device_id])
        assert_figures(device.hlo_execution_time_us, expected, str(points[device.device_id]))


# --- 6. tpu-ls --runtime-status against libtpu.sdk.tpuz.get_core_state_summary() ------------------------------

@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_tpu_ls_runtime_status_names_the_cores_states_and_programs_the_sdk_names(name, tmp_path):
    reading = sdk(name)
    sysroot.v5e_host(tmp_path)
    with FakeMetricsService(FIXTURES[name]()) as service:
        result = run_tool("tpu-ls", "--json", "--runtime-status", "--metrics-addr", service.address,
                          env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    status = next(s for s in json.loads(result.stdout)["libtpu_runtime_status"] if s["address"] == service.address)
    if reading.runtime_status is None:  # a runtime without the rpc: the SDK raises, tpu-ls says not served
        assert "Method not found" in str(reading.runtime_status_error)
        assert status["served"] is False
        return
    summary = reading.runtime_status
    assert status["host_name"] == summary["host_name"]
    theirs = {int(key): core for key, core in summary["core_states"].items()}
    assert sorted(c["global_core_id"] for c in status["cores"]) == sorted(theirs)
    for core in status["cores"]:
        sdk_core = theirs[core["global_core_id"]]
        assert core["chip_id"] == sdk_core["core_id"]["chip_id"]
        assert core["core_index"] == sdk_core["core_id"]["core_on_chip"]["index"]
        assert core["state"] == ("error" if sdk_core.get("error_message") else "ok")
        assert core["error_message"] == (sdk_core.get("error_message") or None)
        assert core["launch_id"] == sdk_core["launch_id"]
        sequencer, sdk_sequencer = core["sequencers"][0], sdk_core["sequencer_info"][0]
        assert (sequencer["program_id"], sequencer["run_id"], sequencer["pc"]) == (
            sdk_sequencer["program_id"], sdk_sequencer["run_id"], sdk_sequencer["pc"])
        assert sequencer["hlo_location"] == (sdk_sequencer.get("hlo_location") or None)
        assert [q["run_id"] for q in core["queued_programs"]] == [
            q["run_id"] for q in sdk_core.get("queued_program_info", [])]
