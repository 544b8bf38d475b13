"""Shared test helpers: run the real console scripts, build fixture hosts, fault-injecting plugins."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import coverage
import pytest
from hypothesis import settings

from tpu_tools.pjrt.runtime import installed_plugin_platforms

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import budget  # noqa: E402  (tests/: the per-test time budget)
import child_coverage  # noqa: E402  (tests/: coverage of the programs the tests start)
import child_lines  # noqa: E402

# A test run started in the background by a non-interactive shell (`tools/test.sh &`) inherits SIGINT
# ignored, and every program the tests start would too: the Ctrl-C tests need it to interrupt them. A Python
# handler here becomes the default action in those programs when they are executed.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Variables that would change how the tools behave; tests set what they need explicitly.
_SCRUBBED = ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "TPU_TOOLS_SYSROOT", "TPU_TOOLS_DEBUG",
             "NO_COLOR", "TPU_RUNTIME_METRICS_PORTS", "TPU_TOOLS_TAG",
             # a test host that is a TPU VM, a Kubernetes node or a job's neighbour must not leak into the tests
             "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_NAME", "TPU_TOPOLOGY",
             "TPU_SKIP_MDS_QUERY", "MEGASCALE_SLICE_ID", "MEGASCALE_NUM_SLICES", "KUBERNETES_SERVICE_HOST",
             "TPU_DEVICE_PLUGIN_METRICS_ADDR", "ORBAX_PROMETHEUS_PORT", "PYGRAIN_PROMETHEUS_PORT",
             "TPU_TOOLS_GCE_METADATA_URL", "TPU_TOOLS_NVML", "TPU_TOOLS_AMDSMI", "ROCM_PATH", "ROCM_HOME",
             # the terminal's size: pytest-xdist's workers get COLUMNS=80 LINES=24, a shell may export others
             "COLUMNS", "LINES")
for _name in ("COLUMNS", "LINES"):  # in-process rendering too; a test that wants a width sets it
    os.environ.pop(_name, None)

# Tests run the same on a machine with an accelerator. Programs never read the host's NVML or amdsmi unless a
# test asks (tests/fakenvml.py, tests/fakeamdsmi.py). Where a GPU or TPU plugin is installed (or
# TPU_TOOLS_TEST_PIN_CPU=1 says to act as if), JAX_PLATFORMS=cpu pins every test to the CPU platform, and tests
# marked `auto_platform` (about JAX's own choice of platform, e.g. a held TPU is not opened when the platform is
# left to JAX) are skipped.
_ACCELERATOR_PLUGINS = sorted(installed_plugin_platforms() - {"cpu", "gpu"})
PIN_CPU = bool(_ACCELERATOR_PLUGINS) or os.environ.get("TPU_TOOLS_TEST_PIN_CPU") == "1"
# libtpu's default metrics address, localhost:8431, is where a TPU VM's job serves: no test may depend on what
# listens there. Every program the tests start (and the code they run in-process) reads libtpu's default service
# at an address this test process holds, bound and never listening: connections there are refused, always.
_DEFAULT_METRICS_HOLDER = socket.socket()
_DEFAULT_METRICS_HOLDER.bind(("127.0.0.1", 0))
DEFAULT_METRICS_ADDR = f"127.0.0.1:{_DEFAULT_METRICS_HOLDER.getsockname()[1]}"
_PINNED = {"TPU_TOOLS_NVML": "0", "TPU_TOOLS_AMDSMI": "0", "TPU_TOOLS_LIBTPU_DEFAULT_ADDR": DEFAULT_METRICS_ADDR,
           **({"JAX_PLATFORMS": "cpu"} if PIN_CPU else {})}
os.environ.update(_PINNED)
# Agents register in a runtime directory; a program that is given none looks in the user's default one, which
# parallel workers (and real jobs of the user) share. Each test process gets its own, private (0700) and
# empty; tests that start agents still give them a directory of their own (tests/agentjobs.py).
if "TPU_TOOLS_RUNTIME_DIR" not in os.environ:
    os.environ["TPU_TOOLS_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tpu-tools-tests-")
    atexit.register(shutil.rmtree, os.environ["TPU_TOOLS_RUNTIME_DIR"], ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "auto_platform: relies on JAX choosing the platform itself (JAX_PLATFORMS "
                                       "unset); skipped where an accelerator plugin is installed")
    config.addinivalue_line("markers", "accelerator: a smoke test on the real accelerator of this host; run "
                                       "only when asked: pytest -m accelerator")
    config.addinivalue_line("markers", f"budget(seconds): this test may take up to SECONDS instead of "
                                       f"{budget.DEFAULT_BUDGET_S:g} s (tests/budget.py)")
    if _measures_coverage(config) and not _is_worker(config) and child_coverage.install():
        child_coverage.make_directory()


def _measures_coverage(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("_cov") and bool(config.option.cov_source) and not config.option.no_cov


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)  # after pytest-cov has started coverage here, which names it for children
def pytest_sessionstart(session: pytest.Session) -> None:
    if not session.config.pluginmanager.has_plugin("dsession"):  # a process that runs tests
        child_coverage.record_children(REPO / "tpu_tools")


# Inside pytest-cov's own wrapper (trylast: the innermost), so the children's lines are written before it combines.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        directory = os.environ.get(child_coverage.DIRECTORY_VARIABLE)
        cov = coverage.Coverage.current()
        if directory and cov is not None and not _is_worker(session.config):
            data_file = session.config.invocation_params.dir / cov.config.data_file
            child_coverage.merge(directory, str(data_file), cov.config.run_omit)


# Hypothesis: the same examples on every run and machine, no deadline (a loaded machine is slow), no example
# database shared between runs or parallel workers. HYPOTHESIS_PROFILE=explore searches anew each run.
settings.register_profile("ci", deadline=None, derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201 (pytest's hook)
    outcome = yield
    budget.check(item, call, outcome.get_result())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    budget.collect(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    budget.summary(terminalreporter.write_line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = "accelerator" in (config.getoption("markexpr") or "")
    for item in items:
        if "accelerator" in item.keywords and not asked:
            item.add_marker(pytest.mark.skip(reason="an accelerator smoke test: run with pytest -m accelerator"))
        if "auto_platform" in item.keywords and PIN_CPU:
            why = ", ".join(_ACCELERATOR_PLUGINS) or "TPU_TOOLS_TEST_PIN_CPU=1"
            item.add_marker(pytest.mark.skip(reason=f"tests are pinned to the CPU platform here ({why})"))


# clean_env(**UNMEASURED): a process coverage does not measure. For the tests' helpers that run none of
# tpu-tools' code, and for the copies of a process whose first copy is measured: each measured process pays
# 10-22 ms of CPU to record its lines and save them (tests/child_lines.py).
UNMEASURED: dict[str, str | None] = {name: None for name in (
    "COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG", "COV_CORE_SOURCE", "COV_CORE_CONFIG", "COV_CORE_DATAFILE",
    child_lines.RECORD_VARIABLE)}


def clean_env(**overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(_PINNED)
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def tool_command(program: str) -> list[str]:
    """The installed console script next to this interpreter, else `python -m tpu_tools <sub>`."""
    script = Path(sys.executable).parent / program
    if script.exists():
        return [str(script)]
    found = shutil.which(program)
    if found:
        return [found]
    sub = program.removeprefix("tpu-")
    return [sys.executable, "-m", "tpu_tools"] + ([] if program == "tpu-tools" else [sub])


def run_tool(program: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
             input: str | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*tool_command(program), *args], capture_output=True, text=True,
                          env=env if env is not None else clean_env(), timeout=timeout, input=input, cwd=cwd)


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """A clean failure: the exit code, and on stderr exactly one non-empty line, naming what failed; it is returned.

    One line means one: no `Usage:` and `Try ...` lines around it, no warning or traceback before it."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one: {result.stderr!r}"
    message = lines[0]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def write_plugin(root: Path, name: str, body: str) -> Path:
    """A PJRT plugin package that jax discovers (jax_plugins namespace) and initialises in-process."""
    package = root / "jax_plugins" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(body))
    return root


@pytest.fixture
def hanging_plugin(tmp_path: Path) -> Path:
    return write_plugin(tmp_path, "hang_forever", """
        import time

        def initialize():
            time.sleep(3600)
    """)


@pytest.fixture
def crashing_plugin(tmp_path: Path) -> Path:
    return write_plugin(tmp_path, "segfaults", """
        import os, signal

        def initialize():
            os.kill(os.getpid(), signal.SIGSEGV)
    """)


from fakeamdsmi import fake_amdsmi_dir  # noqa: E402,F401  (the fake libamd_smi.so, a session fixture)
from fakenvml import fake_nvml_dir  # noqa: E402,F401  (the fake NVML library, a session fixture for every module)


@pytest.fixture
def refused_address() -> Iterator[str]:
    """"127.0.0.1:PORT" that refuses connections for the whole test (tests/isolation.py)."""
    with isolation.refused_address() as address:
        yield address


import isolation  # noqa: E402  (tests/: ports, tmux servers and names a test owns)


def report_document(report: Any) -> dict[str, Any]:
    """A monitor report (a typed record) as the JSON document tpu-monitor writes, to assert on its shape."""
    from tpu_tools import jsonout

    document: dict[str, Any] = json.loads(jsonout.dumps(report))
    return document


def as_report(document: dict[str, Any]) -> Any:
    """A monitor report record from a test's document of the report's JSON shape (a header it leaves out is blank),
    checked as a report from outside is: a group of the wrong shape fails here."""
    from tpu_tools.metrics.records.report import MonitorReport, report_from_document

    return document if isinstance(document, MonitorReport) else report_from_document(document)
