"""Runtime policy: what reaches the environment before jax is imported."""

from __future__ import annotations

import pytest

from tpu_tools.errors import PlatformUnavailable, UsageError
from tpu_tools.pjrt.runtime import (
    RuntimePolicy,
    check_platform_installed,
    explain_backend_error,
    installed_plugin_platforms,
    resolve_platforms,
)


def test_platform_choice_sets_jax_platforms():
    env = RuntimePolicy(platform="cpu").environment({"JAX_PLATFORMS": "tpu"})
    assert env["JAX_PLATFORMS"] == "cpu"


def test_auto_follows_jax_platforms_and_unsets_nothing_else():
    env = RuntimePolicy().environment({"JAX_PLATFORMS": "cpu", "OTHER": "1"})
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["OTHER"] == "1"
    assert "JAX_PLATFORMS" not in RuntimePolicy().environment({"PATH": "/bin"})


def test_host_devices_sets_both_the_config_and_the_xla_flag():
    env = RuntimePolicy(host_devices=8).environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --a=1"})
    assert env["JAX_NUM_CPU_DEVICES"] == "8"
    assert env["XLA_FLAGS"].split() == ["--a=1", "--xla_force_host_platform_device_count=8"]


def test_extra_xla_flags_are_appended_and_preallocation_can_be_disabled():
    env = RuntimePolicy(xla_flags=("--xla_dump_to=/tmp/x",), preallocate=False).environment({"XLA_FLAGS": "--b=2"})
    assert env["XLA_FLAGS"] == "--b=2 --xla_dump_to=/tmp/x"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


@pytest.mark.parametrize("value", ["garbage", "cpu,nonsense", "tpuu"])
def test_garbage_jax_platforms_is_a_usage_error(value):
    with pytest.raises(UsageError, match="JAX_PLATFORMS"):
        resolve_platforms("auto", {"JAX_PLATFORMS": value})


def test_jax_platforms_is_normalised():
    assert resolve_platforms("auto", {"JAX_PLATFORMS": " CPU , tpu "}) == "cpu,tpu"


def test_missing_tpu_plugin_is_reported_before_starting_anything(monkeypatch):
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    with pytest.raises(PlatformUnavailable, match="libtpu is not installed or no TPU was found"):
        check_platform_installed(RuntimePolicy(platform="tpu"))
    if "gpu" in installed_plugin_platforms():  # a GPU machine: its plugin is there, nothing to report
        check_platform_installed(RuntimePolicy(platform="gpu"))
    else:
        with pytest.raises(PlatformUnavailable, match="CUDA or ROCm"):
            check_platform_installed(RuntimePolicy(platform="gpu"))
    check_platform_installed(RuntimePolicy(platform="cpu"))  # always built in


@pytest.mark.parametrize(("platform", "message", "expected"), [
    ("tpu", "RuntimeError: Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: "
            "cannot open shared object file", "libtpu is not installed"),
    ("rocm", "Unable to initialize backend 'rocm': Backend 'rocm' is not in the list of known backends",
     "its PJRT plugin is not installed"),
    ("tpu", "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process 77",
     "in use by another process"),
    ("cuda", "Unable to initialize backend 'cuda': no visible devices", "found no device"),
    ("cpu", "something odd", "failed to start: something odd"),
])
def test_backend_errors_become_one_sentence(platform, message, expected):
    sentence = explain_backend_error(platform, message)
    assert expected in sentence
    assert "\n" not in sentence
