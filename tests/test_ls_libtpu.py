"""`tpu-ls` with libtpu's metrics service: figures per chip while a job holds the TPU, runtime status, faults."""

from __future__ import annotations

import json

import pytest
import sysroot
from conftest import DEFAULT_METRICS_ADDR, assert_one_line_error, clean_env, run_tool
from libtpu_server import FakeMetricsService, v4_host, v5e_host, v6e_host
from test_libtpu_client import SNAPSHOT_KEYS

LIBTPU_FIGURE_KEYS = {"address", "device_ids", "hbm_used_bytes", "hbm_total_bytes", "duty_cycle_percent"}
STATUS_KEYS = {"address", "error", "served", "host_name", "cores"}


@pytest.fixture
def held_v5e(tmp_path):
    sysroot.v5e_host(tmp_path, holders={3001: list(range(8))})
    return clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))


def rows(stdout: str, first_word: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.split()[:1] == [first_word]]


@pytest.mark.auto_platform  # a held TPU is detected only when the platform is left to JAX
def test_held_tpu_shows_the_jobs_duty_cycle_and_hbm_per_chip(held_v5e):
    with FakeMetricsService(v5e_host()) as service:
        result = run_tool("tpu-ls", "--metrics-addr", service.address, env=held_v5e)
        document = json.loads(run_tool("tpu-ls", "--json", "--metrics-addr", service.address, env=held_v5e).stdout)
    assert result.returncode == 0, result.stderr
    assert "runtime held" in result.stdout
    assert "DUTY CYCLE" in result.stdout
    assert "HBM USED / TOTAL" in result.stdout
    chip0 = rows(result.stdout, "0")[0]
    assert "87.5%" in chip0
    assert "11.2 GiB / 16.0 GiB" in chip0
    assert "3001 python3 train.py" in chip0
    assert result.stderr == ""
    assert document["runtime_status"] == "held"
    assert document["schema"] == "tpu-tools/ls/v1"
    figures = document["chips"][1]["libtpu"]
    assert set(figures) == LIBTPU_FIGURE_KEYS
    assert figures["address"] == service.address
    assert figures["device_ids"] == [1]
    assert figures["duty_cycle_percent"] == 88.1
    assert figures["hbm_total_bytes"] == 16 << 30
    default, ours = document["libtpu_metrics"]
    assert default["address"] == DEFAULT_METRICS_ADDR
    assert "connection refused" in default["error"]
    assert set(ours) == SNAPSHOT_KEYS
    assert ours["error"] is None
    assert len(ours["devices"]) == 8


def test_ports_from_the_environment_and_a_per_chip_duty_cycle(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0, 1, 2, 3]})
    with FakeMetricsService(v4_host()) as service:
        env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), TPU_RUNTIME_METRICS_PORTS=str(service.port))
        document = json.loads(run_tool("tpu-ls", "--json", env=env).stdout)
    assert [s["address"] for s in document["libtpu_metrics"]] == [DEFAULT_METRICS_ADDR, f"localhost:{service.port}"]
    assert document["libtpu_metrics"][1]["duty_cycle_scope"] == "chip"
    assert [c["libtpu"]["duty_cycle_percent"] for c in document["chips"]] == [45.0, 47.5, 44.2, 46.8]


def test_runtime_status_shows_per_core_state_and_errors(held_v5e, tmp_path):
    with FakeMetricsService(v5e_host()) as service:
        result = run_tool("tpu-ls", "--runtime-status", "--metrics-addr", service.address, env=held_v5e)
        document = json.loads(run_tool("tpu-ls", "--json", "--runtime-status", "--metrics-addr", service.address,
                                       env=held_v5e).stdout)
    assert result.returncode == 0, result.stderr
    assert f"libtpu runtime status at {service.address}, host t1v-n-5e8-w-0" in result.stdout
    core5 = [line for line in result.stdout.splitlines() if "aborted" in line][0]
    assert core5.split()[:5] == ["5", "5", "tensor", "core", "0"]
    assert " error " in core5
    assert "HBM out-of-memory" in core5
    statuses = document["libtpu_runtime_status"]
    assert statuses[0]["error"]
    assert set(statuses[1]) == STATUS_KEYS
    assert statuses[1]["cores"][5]["state"] == "error"
    assert statuses[1]["cores"][0]["state"] == "ok"


def test_runtime_status_of_an_older_runtime_and_of_no_runtime(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0, 1, 2, 3]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    with FakeMetricsService(v4_host()) as service:
        older = run_tool("tpu-ls", "--runtime-status", "--metrics-addr", service.address, env=env)
    assert f"libtpu runtime status at {service.address}: not served by this runtime" in older.stdout
    nobody = run_tool("tpu-ls", "--runtime-status", "--metrics-addr", "127.0.0.1:1", env=env)
    assert nobody.returncode == 0
    assert (f"libtpu runtime status: no metrics service answered (tried {DEFAULT_METRICS_ADDR}, 127.0.0.1:1)"
            in nobody.stdout)


@pytest.mark.auto_platform  # a held TPU is detected only when the platform is left to JAX
def test_no_service_changes_nothing_and_says_so_only_under_debug(held_v5e):
    quiet = run_tool("tpu-ls", "--metrics-addr", "127.0.0.1:1", env=held_v5e)
    assert quiet.returncode == 0
    assert quiet.stderr == ""
    assert "DUTY CYCLE" not in quiet.stdout
    assert quiet.stdout.count("TPU v5e") == 8
    debug = run_tool("tpu-ls", "--debug", "--metrics-addr", "127.0.0.1:1", env=held_v5e)
    assert debug.returncode == 0
    assert debug.stdout == quiet.stdout
    assert debug.stderr.splitlines() == [f"libtpu metrics: no metrics service at {DEFAULT_METRICS_ADDR} (connection "
                                         "refused); no metrics service at 127.0.0.1:1 (connection refused)"]


@pytest.mark.auto_platform  # a held TPU is detected only when the platform is left to JAX
def test_a_hanging_service_costs_the_metrics_deadline_then_ls_carries_on(held_v5e):
    with FakeMetricsService(v5e_host()) as service:
        service.hang()
        result = run_tool("tpu-ls", "--debug", "--metrics-timeout", "0.3", "--metrics-addr", service.address,
                          env=held_v5e, timeout=120)  # the hang guard: the service never answers
    assert result.returncode == 0
    assert result.stdout.count("TPU v5e") == 8
    assert "DUTY CYCLE" not in result.stdout
    assert f"the metrics service at {service.address} did not answer within 0.3 s" in result.stderr


def test_service_devices_that_do_not_pair_get_a_table_of_their_own():
    with FakeMetricsService(v6e_host()) as service:
        result = run_tool("tpu-ls", "--platform", "cpu", "--metrics-addr", service.address)
    assert result.returncode == 0, result.stderr
    assert "libtpu metrics service" in result.stdout
    table = result.stdout.split("libtpu metrics service", 1)[1]
    assert len(rows(table, service.address)) == 4
    assert "99.1%" in table
    assert "27.5 GiB / 32.0 GiB" in table
    assert "note: the libtpu metrics service reports 4 devices, which do not pair" in result.stdout


@pytest.mark.parametrize(("args", "env", "fragment"), [
    (["--metrics-addr", "nonsense"], {}, "metrics address 'nonsense' is not HOST:PORT"),
    (["--metrics-addr", "localhost:70000"], {}, "is not HOST:PORT"),
    (["--metrics-timeout", "0"], {}, "--metrics-timeout"),
    ([], {"TPU_RUNTIME_METRICS_PORTS": "8431,eight"}, "'eight' is not a port number"),
])
def test_bad_metrics_input_is_a_usage_error(args, env, fragment):
    result = run_tool("tpu-ls", "--no-runtime", *args, env=clean_env(**env))
    assert_one_line_error(result, 2, fragment)


def test_attach_libtpu_pairs_again_on_every_refresh(tmp_path, monkeypatch):
    """What a refreshing view (tpu-top) does: one inventory, a new read of the services each refresh."""
    from tpu_tools.inventory import attach_libtpu, build_inventory
    from tpu_tools.metrics.libtpu import LibtpuClient
    from tpu_tools.pjrt.runtime import RuntimePolicy

    sysroot.v5e_host(tmp_path, holders={3001: list(range(8))})
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(tmp_path))
    inventory = build_inventory(RuntimePolicy(), use_runtime=False)
    service = FakeMetricsService(v5e_host()).start()
    try:
        with LibtpuClient([service.address], timeout_s=0.5) as client:
            attach_libtpu(inventory, client.snapshot())
            assert inventory.chip_libtpu[7].usage.hbm_used_bytes == int(11.5 * (1 << 30))
            service.stop()
            attach_libtpu(inventory, client.snapshot())
            assert inventory.chip_libtpu == {}
            assert not inventory.libtpu[0].ok
            assert inventory.all_notes() == inventory.discovery.notes + inventory.notes
    finally:
        service.stop()
