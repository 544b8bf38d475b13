"""The torch_xla environment of the tests: where it is looked for, and that the suite fails without it in CI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch_xla_env


def test_missing_install_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    why = torch_xla_env.unavailable(tmp_path / "bin" / "python")
    assert why is not None
    assert str(tmp_path) in why
    assert "tools/test.sh" in why


def test_the_tests_fail_rather_than_skip_where_torch_xla_is_required(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(torch_xla_env.PYTHON_VARIABLE, str(tmp_path / "bin" / "python"))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(torch_xla_env.REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match="torch_xla is required here"):
        torch_xla_env.require()
    monkeypatch.delenv(torch_xla_env.REQUIRE_VARIABLE)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        torch_xla_env.require()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        torch_xla_env.require()


def test_the_installed_environment_imports_torch_xla_on_the_cpu_platform() -> None:
    python = torch_xla_env.require()
    done = subprocess.run([str(python), "-c", "import torch, torch_xla, tpu_tools; "
                           "print(torch.__version__.split('+')[0], torch_xla.__version__, torch_xla.device())"],
                          env=torch_xla_env.job_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [torch_xla_env.VERSION, torch_xla_env.VERSION, "xla:0"]
