"""tpu-ls's head start: a runtime child started before the CLI is imported is used only for exactly its query."""

from __future__ import annotations

import subprocess
import time

import pytest
import sysroot
from conftest import clean_env, tool_command

from tpu_tools.pjrt import headstart, queries
from tpu_tools.pjrt.runtime import RuntimePolicy

POLICY = RuntimePolicy(platform="cpu")


@pytest.fixture(autouse=True)
def _fixture_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(tmp_path))
    yield
    headstart.cancel()


def _exits(call, deadline_s: float = 30.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while call.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return call.process.poll() is not None


def test_the_child_started_ahead_is_taken_over_by_the_same_query():
    headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, POLICY, 60.0)
    ahead = headstart._ahead
    assert ahead is not None
    call = headstart.take_or_start(queries.LIST_DEVICES, {"probe": False}, RuntimePolicy(platform="cpu"), 60.0)
    assert call is ahead.call
    assert headstart._ahead is None
    assert call.result()["runtime"]["platform"] == "cpu"


def test_a_different_query_gets_its_own_child_and_the_early_one_is_killed():
    headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, POLICY, 60.0)
    early = headstart._ahead.call
    call = headstart.take_or_start(queries.LIST_DEVICES, {"probe": False},
                                   RuntimePolicy(platform="cpu", host_devices=2), 60.0)
    assert call is not early
    assert _exits(early)
    assert len(call.result()["runtime"]["devices"]) == 2


def test_nothing_starts_ahead_of_a_held_tpu_or_a_gpu_driver(tmp_path, monkeypatch):
    # the platform left to JAX, as a plain `tpu-ls` leaves it (the suite pins the CPU platform on a host with an
    # accelerator plugin); the fixture host holds its TPU, so nothing may start
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    sysroot.v4_host(tmp_path, holders={2001: [0]})
    headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, RuntimePolicy(), 60.0)
    assert headstart._ahead is None
    for node in headstart.GPU_DRIVER_NODES:
        other = tmp_path / node.replace("/", "_")
        (other / node).parent.mkdir(parents=True, exist_ok=True)
        (other / node).touch()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TPU_TOOLS_SYSROOT", str(other))
            headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, POLICY, 60.0)
        assert headstart._ahead is None


def test_cancel_kills_an_unused_child():
    headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, POLICY, 60.0)
    early = headstart._ahead.call
    headstart.cancel()
    assert _exits(early)
    assert headstart._ahead is None


def test_plain_tpu_ls_lists_the_cpu_devices_through_its_head_start(tmp_path):
    done = subprocess.run([*tool_command("tpu-ls"), "--json"], capture_output=True, text=True, timeout=120,
                          env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr
    assert '"runtime_status": "ok"' in done.stdout
