"""The libtpu metrics client against an in-process gRPC service speaking the project's own .proto."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from conftest import clean_env
from libtpu_server import (
    DCN_LATENCY,
    DUTY_CYCLE,
    GIB,
    HBM_TOTAL,
    HBM_USAGE,
    HBM_UTILIZATION,
    HLO_EXECUTION_TIMING,
    HLO_LAYOUT,
    HLO_QUEUE_SIZE,
    TENSORCORE_IDLE,
    UNKNOWN_METRIC,
    FakeMetricsService,
    HostFixture,
    distribution,
    gauge,
    int_attr,
    kvlist,
    ordinal,
    string_attr,
    tpu7x_host,
    v4_host,
    v5e_host,
    v6e_host,
)

from tpu_tools.errors import UsageError
from tpu_tools.metrics.libtpu import LibtpuClient, metrics_addresses, read_once
from tpu_tools.metrics.libtpu.addresses import default_address, probe_connection
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb

SNAPSHOT_KEYS = {"address", "error", "elapsed_ms", "served_metrics", "not_served_metrics", "unread_metrics",
                 "duty_cycle_scope", "devices", "transfer_latencies", "delivery_rates", "notes"}
DEVICE_KEYS = {"device_id", "hbm_used_bytes", "hbm_total_bytes", "duty_cycle_percent",
               "hbm_bandwidth_utilization_percent", "tensorcore_idle_duration_s", "hlo_queue_size",
               "hlo_execution_time_us"}
SUMMARY_KEYS = {"count", "mean", "min", "max", "p50", "p90", "p95", "p99", "p999"}


def snapshot_of(fixture: HostFixture, timeout_s: float = 2.0):
    with FakeMetricsService(fixture) as service, LibtpuClient([service.address], timeout_s) as client:
        return client.snapshot()[0]


# --- fixture hosts ----------------------------------------------------------------------------------

def test_v5e_host_per_device_duty_cycle_int_ordinals_and_no_samples():
    snapshot = snapshot_of(v5e_host())
    assert snapshot.ok
    assert snapshot.duty_cycle_scope == "device"
    assert snapshot.notes == []
    document = snapshot.to_dict()
    assert set(document) == SNAPSHOT_KEYS
    assert set(document["devices"][0]) == DEVICE_KEYS
    assert [d.device_id for d in snapshot.devices] == list(range(8))
    first, idle = snapshot.devices[0], snapshot.devices[7]
    assert (first.hbm_used_bytes, first.hbm_total_bytes) == (int(11.2 * GIB), 16 * GIB)
    assert first.duty_cycle_percent == 87.5
    assert first.hlo_queue_size == 2
    timing = first.hlo_execution_time_us
    assert timing.count == 200
    assert timing.min <= timing.p50 <= timing.p90 <= timing.p99 <= timing.p999 <= timing.max
    assert 2000 < timing.p50 < 2900
    # A device that ran nothing yet: an empty distribution is "no samples", not a figure.
    assert idle.hlo_execution_time_us.count == 0
    assert idle.hlo_execution_time_us.p50 is None
    # Newer metrics this libtpu does not serve: named, not errors.
    assert HBM_UTILIZATION in snapshot.not_served_metrics
    assert TENSORCORE_IDLE in snapshot.not_served_metrics
    assert not snapshot.serves_field("hbm_bandwidth_utilization_percent")
    assert snapshot.serves_field("hlo_queue_size")
    assert first.hbm_bandwidth_utilization_percent is None
    assert snapshot.transfer_latencies == []


def test_v6e_host_newer_metrics_string_ordinals_and_transfer_latencies_by_buffer_size():
    snapshot = snapshot_of(v6e_host())
    assert snapshot.ok
    assert snapshot.notes == []
    device = snapshot.devices[2]
    assert device.hbm_bandwidth_utilization_percent == 62.3
    assert device.tensorcore_idle_duration_s == 0.003
    assert device.hlo_queue_size == 1
    assert device.hlo_execution_time_us.count == 300  # ordinal "2" read as 2
    latencies = {(t.name, t.buffer_size): t.latency_us for t in snapshot.transfer_latencies}
    assert [t.buffer_size for t in snapshot.transfer_latencies if t.metric == DCN_LATENCY] == ["1MB", "8MB", "64MB"]
    dcn = latencies[("dcn_transfer_latencies", "8MB")]
    assert dcn.count == 240  # two slices of 120 samples merged bucket by bucket
    assert 700 < dcn.p50 < 1300
    assert dcn.p50 <= dcn.p99 <= dcn.max
    assert latencies[("host_to_device_transfer_latencies", "16MB")].count == 90  # linear buckets
    assert latencies[("collective_end_to_end_latencies", "8MB")].count == 60  # explicit buckets
    assert set(snapshot.transfer_latencies[0].to_dict()) == {"metric", "name", "buffer_size", "latency_us"}
    assert set(snapshot.transfer_latencies[0].to_dict()["latency_us"]) == SUMMARY_KEYS
    # A metric name this client does not know is listed as served but unread, never an error.
    assert snapshot.unread_metrics == [UNKNOWN_METRIC]
    assert UNKNOWN_METRIC in snapshot.served_metrics


def test_v4_host_duty_cycle_per_chip_and_an_older_metric_set():
    snapshot = snapshot_of(v4_host())
    assert snapshot.duty_cycle_scope == "chip"
    assert [d.duty_cycle_percent for d in snapshot.devices] == [45.0, 47.5, 44.2, 46.8]
    assert snapshot.devices[3].hlo_queue_size == 3
    assert snapshot.devices[3].hbm_bandwidth_utilization_percent is None
    assert HBM_UTILIZATION in snapshot.not_served_metrics


def test_a_chip_duty_cycle_covers_both_devices_of_a_two_device_chip():
    snapshot = snapshot_of(tpu7x_host())
    assert snapshot.duty_cycle_scope == "chip"
    assert [d.duty_cycle_percent for d in snapshot.devices] == [70.0, 70.0, 71.0, 71.0, 72.0, 72.0, 73.0, 73.0]


def test_runtime_status_per_core_state_and_errors():
    fixture = v5e_host()
    with FakeMetricsService(fixture) as service, LibtpuClient([service.address]) as client:
        status = client.runtime_status(include_hlo_info=True)[0]
        assert service.servicer.requests[-1][1].include_hlo_info
    assert status.ok
    assert status.host_name == "t1v-n-5e8-w-0"
    assert len(status.cores) == 8
    broken = status.cores[5]
    assert broken.state == "error"
    assert "HBM out-of-memory" in broken.error_message
    core = status.cores[0]
    assert (core.state, core.chip_id, core.core_type, core.core_index) == ("ok", 0, "tensor_core", 0)
    assert core.current.program_id == 7
    assert core.current.pc == 0x1A40
    assert len(core.queued_programs) == 1
    assert core.program_fingerprint == "3fa29c01"
    assert set(core.to_dict()) >= {"global_core_id", "chip_id", "state", "error_message", "sequencers"}


def test_runtime_status_of_an_older_runtime_is_not_served():
    with FakeMetricsService(v4_host()) as service, LibtpuClient([service.address]) as client:
        status = client.runtime_status()[0]
    assert not status.served
    assert status.error is None
    assert status.cores == []


# --- channels and deadlines -------------------------------------------------------------------------

def test_one_channel_per_address_reused_across_refreshes():
    with FakeMetricsService(v6e_host()) as service, LibtpuClient([service.address]) as client:
        for _ in range(3):
            assert client.snapshot()[0].ok
        assert len(service.servicer.peers) == 1  # one client socket for all calls
        assert service.servicer.calls["ListSupportedMetrics"] == 3


def test_no_service_listening_is_an_error_field_not_an_exception():
    with LibtpuClient(["127.0.0.1:1"], timeout_s=0.5) as client:
        snapshot = client.snapshot()[0]
        status = client.runtime_status()[0]
    assert snapshot.error == "no metrics service at 127.0.0.1:1 (connection refused)"
    assert status.error == snapshot.error
    assert snapshot.devices == []


def test_a_hanging_service_costs_its_deadline_and_the_others_carry_on():
    with FakeMetricsService(v5e_host()) as stalled, FakeMetricsService(v4_host()) as healthy:
        stalled.hang()
        # One deadline covers a whole refresh (the lists and the reads); the healthy one's reads start as soon as
        # its list is in, not after the stalled one's deadline.
        with LibtpuClient([stalled.address, healthy.address], timeout_s=0.3) as client:
            hung, fine = client.snapshot()
            status = client.runtime_status()[0]
    assert hung.error == f"the metrics service at {stalled.address} did not answer within 0.3 s"
    assert fine.ok
    assert len(fine.devices) == 4  # read within the deadline the stalled one used up: side by side
    assert "did not answer within 0.3 s" in status.error


def test_a_service_that_dies_between_refreshes_and_comes_back():
    service = FakeMetricsService(v5e_host()).start()
    try:
        with LibtpuClient([service.address], timeout_s=0.5) as client:
            assert client.snapshot()[0].ok
            service.stop()
            gone = client.snapshot()[0]
            assert gone.error is not None
            assert gone.devices == []
            service.start()  # same port: the runtime restarted
            deadline = time.monotonic() + 5
            back = client.snapshot()[0]
            while not back.ok and time.monotonic() < deadline:
                time.sleep(0.1)
                back = client.snapshot()[0]
            assert back.ok
            assert len(back.devices) == 8
    finally:
        service.stop()


def test_a_runtime_that_starts_after_the_client_is_read_at_the_next_refresh():
    """Where nothing listens (a host without a TPU job), each refresh costs one refused TCP connection and no gRPC
    channel waits out its reconnect backoff: a runtime that starts is read at the very next refresh."""
    service = FakeMetricsService(v5e_host()).start()
    service.stop()  # a port where nothing listens now
    try:
        with LibtpuClient([service.address], timeout_s=2.0) as client:
            for _ in range(3):
                assert client.snapshot()[0].error == f"no metrics service at {service.address} (connection refused)"
            service.start()
            back = client.snapshot()[0]
            assert back.ok
            assert len(back.devices) == 8
    finally:
        service.stop()


def test_the_connection_probe_tells_a_listener_from_a_refusal():
    service = FakeMetricsService(v5e_host()).start()
    try:
        assert probe_connection(service.address) is True
    finally:
        service.stop()
    assert probe_connection(service.address) is False  # nothing listens there now: refused at once


# --- odd answers ------------------------------------------------------------------------------------

def test_empty_answers():
    nothing_listed = snapshot_of(HostFixture("empty", {}))
    assert nothing_listed.ok
    assert nothing_listed.devices == []
    assert nothing_listed.served_metrics == []
    assert HBM_USAGE in nothing_listed.not_served_metrics
    no_points = snapshot_of(HostFixture("no-points", {HBM_USAGE: [], DUTY_CYCLE: []}))
    assert no_points.ok
    assert no_points.devices == []
    assert no_points.duty_cycle_scope is None
    assert no_points.notes == [f"served with no data points: {HBM_USAGE}, {DUTY_CYCLE}"]


def test_a_listed_metric_the_service_then_does_not_find_is_not_served():
    fixture = HostFixture("liar", {HBM_USAGE: [gauge(int_attr("device-id", 0), GIB)]},
                          listed=[HBM_USAGE, HBM_TOTAL])
    snapshot = snapshot_of(fixture)
    assert snapshot.ok
    assert snapshot.served_metrics == [HBM_USAGE]
    assert HBM_TOTAL in snapshot.not_served_metrics
    assert snapshot.notes == [f"{HBM_TOTAL} is listed but the service answered NOT_FOUND"]
    assert snapshot.devices[0].hbm_used_bytes == GIB
    assert snapshot.devices[0].hbm_total_bytes is None


def test_a_runtime_that_cannot_list_its_metrics_is_asked_for_each_known_one():
    fixture = v4_host()
    fixture.list_unimplemented = True
    snapshot = snapshot_of(fixture)
    assert snapshot.ok
    assert len(snapshot.devices) == 4
    assert snapshot.devices[0].duty_cycle_percent == 45.0
    assert set(snapshot.served_metrics) == set(fixture.metrics)
    assert "does not list its metrics" in snapshot.notes[0]


def test_malformed_data_points_are_skipped_with_a_note():
    fixture = HostFixture("malformed", {
        HBM_USAGE: [gauge(int_attr("device-id", 0), 5 * GIB),
                    gauge(string_attr("device-id", "zero"), GIB),  # not a number
                    gauge(int_attr("device-id", 1), -1),  # negative bytes
                    gauge(int_attr("device-id", 2), True),  # a bool where bytes belong
                    gauge(int_attr("device-id", 3), str(GIB)),  # a numeric string is fine
                    pb.Metric(attribute=int_attr("device-id", 0), gauge=pb.Gauge(as_int=1))],  # repeated id
        HLO_QUEUE_SIZE: [gauge(ordinal("x7"), 1), gauge(kvlist(string_attr("core_type", "tc")), 1),
                         gauge(ordinal(0), 4)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(0), [5.0, 6.0], HLO_LAYOUT),
                               gauge(ordinal(3), 1.0)],  # not a distribution
    })
    broken_layout = distribution(ordinal(3), [5.0], HLO_LAYOUT)
    broken_layout.distribution.bucket_options.exponential_buckets.growth_factor = 0.5
    fixture.metrics[HLO_EXECUTION_TIMING].append(broken_layout)
    snapshot = snapshot_of(fixture)
    assert snapshot.ok
    figures = {d.device_id: d for d in snapshot.devices}
    assert figures[0].hbm_used_bytes == 5 * GIB
    assert figures[3].hbm_used_bytes == GIB
    assert figures[0].hlo_queue_size == 4
    assert figures[0].hlo_execution_time_us.count == 2
    assert figures[3].hlo_execution_time_us.count == 1
    assert figures[3].hlo_execution_time_us.p50 is None
    notes = "\n".join(snapshot.notes)
    assert f"{HBM_USAGE}: skipped 3 data points with no usable device id or value" in notes
    assert f"{HBM_USAGE}: skipped 1 data point repeating a device id" in notes
    assert f"{HLO_QUEUE_SIZE}: skipped 2 data points" in notes
    assert "growth_factor > 1" in notes


def test_mismatched_device_ids_are_kept_and_noted():
    fixture = HostFixture("mismatch", {
        HBM_USAGE: [gauge(int_attr("device-id", d), GIB) for d in range(4)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 16 * GIB) for d in (0, 1, 2, 9)],
        DUTY_CYCLE: [gauge(int_attr("device-id", d), 50.0) for d in (0, 1, 2, 3, 4)],
        HLO_QUEUE_SIZE: [gauge(ordinal(12), 1)],
    })
    snapshot = snapshot_of(fixture)
    assert [d.device_id for d in snapshot.devices] == [0, 1, 2, 3, 4, 9, 12]
    assert snapshot.device(3).hbm_total_bytes is None
    assert snapshot.device(9).hbm_used_bytes is None
    notes = "\n".join(snapshot.notes)
    assert f"{HBM_TOTAL} has no data for devices 3, 12" in notes
    assert f"{DUTY_CYCLE} reports devices 0, 1, 2, 3, 4 but the HBM metrics report 0, 1, 2, 3, 9" in notes


# --- addresses and the one-shot read ----------------------------------------------------------------

def test_addresses_default_environment_and_explicit():
    env = {"TPU_RUNTIME_METRICS_PORTS": "8431, 8432,8433"}
    assert metrics_addresses(["127.0.0.1:9000", "8434", "[::1]:8435", "localhost:8432"], env) == [
        "localhost:8431", "localhost:8432", "localhost:8433", "127.0.0.1:9000", "localhost:8434", "[::1]:8435"]
    assert metrics_addresses([], {}) == ["localhost:8431"]


def test_the_default_address_can_be_moved():
    assert default_address({}) == "localhost:8431"
    moved = {"TPU_TOOLS_LIBTPU_DEFAULT_ADDR": "127.0.0.1:9431", "TPU_RUNTIME_METRICS_PORTS": "8432"}
    assert metrics_addresses(["9000"], moved) == ["127.0.0.1:9431", "localhost:8432", "localhost:9000"]
    with pytest.raises(UsageError, match="TPU_TOOLS_LIBTPU_DEFAULT_ADDR='nowhere': metrics address 'nowhere' is not"):
        default_address({"TPU_TOOLS_LIBTPU_DEFAULT_ADDR": "nowhere"})


@pytest.mark.parametrize(("explicit", "env", "message"), [
    (["localhost"], "", "is not HOST:PORT"),
    (["localhost:0"], "", "is not HOST:PORT"),
    (["host:99999"], "", "is not HOST:PORT"),
    (["::1:8431"], "", "IPv6 host in brackets"),
    ([], "8431,84x1", "TPU_RUNTIME_METRICS_PORTS='8431,84x1': '84x1' is not a port number"),
])
def test_bad_addresses_are_usage_errors(explicit, env, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        metrics_addresses(explicit, {"TPU_RUNTIME_METRICS_PORTS": env})


def test_read_once_pays_for_grpc_only_when_something_listens():
    code = ("import sys; from tpu_tools.metrics.libtpu import read_once; "
            "snapshots, status = read_once(['127.0.0.1:1'], 0.5, runtime_status=True); "
            "print(snapshots[0].error, status[0].error, 'grpc' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert result.stdout.split(")")[-1].strip() == "False", result.stdout + result.stderr
    with FakeMetricsService(v6e_host()) as service:
        snapshots, statuses = read_once(["127.0.0.1:1", service.address], 1.0, runtime_status=True)
    assert [s.ok for s in snapshots] == [False, True]
    assert statuses[1].host_name == "t1v-n-6e4-w-3"


# --- what monitor and Prometheus consume ------------------------------------------------------------

def test_report_group_gauge_and_histogram_samples():
    from tpu_tools.metrics.libtpu.export import gauge_samples, histogram_samples, report_group

    with FakeMetricsService(v5e_host()) as service, LibtpuClient(["127.0.0.1:1", service.address]) as client:
        snapshots = client.snapshot()
    group = report_group(snapshots)
    assert group.error is None
    assert [s.address for s in group.services] == ["127.0.0.1:1", service.address]
    assert "connection refused" in (report_group(snapshots[:1]).error or "")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in gauge_samples(snapshots)}
    here = ("address", service.address)
    assert samples[("tpu_tools_libtpu_up", (("address", "127.0.0.1:1"),))] == 0.0
    assert samples[("tpu_tools_libtpu_up", (here,))] == 1.0
    assert samples[("tpu_tools_libtpu_duty_cycle_ratio", (here, ("device", "1")))] == 0.881
    histograms = {(s.name, tuple(sorted(s.labels.items()))): s for s in histogram_samples(snapshots)}
    hlo = histograms[("tpu_tools_libtpu_hlo_execution_time_seconds", (here, ("device", "0")))]
    assert hlo.buckets[-1] == (math.inf, 200)
    assert hlo.buckets[0][0] == 1e-6
    assert hlo.sum > 0
    assert [count for _, count in hlo.buckets] == sorted(count for _, count in hlo.buckets)  # cumulative
    # Not served (bandwidth) and no samples (device 7): no made-up values.
    assert not any(name == "tpu_tools_libtpu_hbm_bandwidth_utilization_ratio" for name, _ in samples)
    empty = histograms[("tpu_tools_libtpu_hlo_execution_time_seconds", (here, ("device", "7")))]
    assert empty.buckets[-1] == (math.inf, 0)
    assert empty.sum == 0.0
