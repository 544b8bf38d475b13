"""The fake libnvidia-ml.so.1 (tests/fake_nvml/fake_nvml.c), built once per test run with gcc.

The real nvidia-ml-py loads it through LD_LIBRARY_PATH in the programs the tests start; its fault switches
are environment variables (see the C file). `nvml_env` gives the environment of such a program on the
sysfs fixture of the same two GPUs (tests/sysroot.py: nvidia_host).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import clean_env

SOURCE = Path(__file__).resolve().parent / "fake_nvml" / "fake_nvml.c"


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake libnvidia-ml.so.1."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "gcc is needed to build the fake NVML library (apt-get install gcc)"
    directory = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(directory / "libnvidia-ml.so.1"), str(SOURCE)], check=True)
    return directory


def nvml_env(library: Path, root: Path | None = None, **switches: str | None) -> dict[str, str]:
    """The environment of a program that finds the fake NVML (and the fixture host at `root`)."""
    env = clean_env(**{"TPU_TOOLS_NVML": None, "LD_LIBRARY_PATH": str(library), **switches})
    if root is not None:
        env["TPU_TOOLS_SYSROOT"] = str(root)
    return env
