"""PyTorch/XLA for the tests: torch 2.9.0 and torch_xla 2.9.0 in an environment of their own.

tools/test.sh installs them outside the clone (`TPU_TOOLS_TEST_TORCH_XLA_PYTHON` names its interpreter; the
`complete` file beside it says the install finished) because torch's PyPI wheel needs 3 GB of NVIDIA's CUDA
wheels to import. The jobs run that interpreter with tpu_tools from the clone on PYTHONPATH, on the CPU platform
(`PJRT_DEVICE=CPU`, `CPU_NUM_DEVICES=N` for several devices). `import torch, torch_xla` takes 18 s or more here:
a test module shares a few long-lived jobs among its tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import clean_env

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
VERSION = "2.9.0"
PYTHON_VARIABLE = "TPU_TOOLS_TEST_TORCH_XLA_PYTHON"
REQUIRE_VARIABLE = "TPU_TOOLS_TEST_REQUIRE_TORCH_XLA"


def default_python() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return cache / "tpu-tools" / f"torch-xla-{VERSION}-{tag}" / "bin" / "python"


def python() -> Path:
    """The interpreter of the torch_xla environment."""
    named = os.environ.get(PYTHON_VARIABLE)
    return Path(named) if named else default_python()


def unavailable(interpreter: Path | None = None) -> str | None:
    """Why torch_xla cannot run in the tests here, or None. Checks the install's marker and finds the packages
    without importing them (the import alone takes 18 s)."""
    interpreter = interpreter or python()
    if not (interpreter.parent.parent / "complete").is_file():
        return f"torch_xla {VERSION} is not installed at {interpreter.parent.parent} (tools/test.sh installs it)"
    probe = subprocess.run([str(interpreter), "-c", "import importlib.util as u, sys; "
                            "sys.exit(0 if u.find_spec('torch') and u.find_spec('torch_xla') else 3)"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"{interpreter} does not find torch and torch_xla: {probe.stderr.strip()[-200:]}"
    return None


def required() -> bool:
    """Whether the torch_xla tests must run here (fail) rather than skip: CI, or tools/test.sh."""
    return os.environ.get("CI") == "true" or os.environ.get(REQUIRE_VARIABLE) == "1"


def require() -> Path:
    """The interpreter; skips the calling test where torch_xla cannot run, fails it where it must (CI)."""
    import pytest

    why = unavailable()
    if why is not None:
        if required():
            pytest.fail(f"torch_xla is required here: {why}")
        pytest.skip(why)
    return python()


def job_env(devices: int = 1, **overrides: str | None) -> dict[str, str]:
    """The environment of a torch_xla job: the CPU platform, tpu_tools and the tests' helpers on the path."""
    wanted: dict[str, str | None] = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices), "JAX_PLATFORMS": "cpu",
                                     "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
                                     "TF_CPP_MIN_LOG_LEVEL": "2"}
    return clean_env(**{**wanted, **overrides})  # an override of None leaves the variable out
