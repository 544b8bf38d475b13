"""A pytest plugin: the CPU time each test costs the machine, its own and that of the programs it ran.

On a machine the suite keeps busy, wall time says little about what a test costs: a test that waits on a
timeout takes long and costs nothing, one that starts JAX three times costs seconds of CPU that every other
test waits for. This adds, per test, the CPU time of the test process and of the child processes it reaped
(`getrusage(RUSAGE_CHILDREN)`: a program the test ran and waited for, with the children that program waited
for), and prints the most expensive files and tests at the end.

    PYTHONPATH=tools .venv/bin/python -m pytest -p pytest_cpu_report -n 4 --dist loadfile  [--cpu-report 30]
        [--cpu-report-json every-test.jsonl]

Under xdist each worker writes its tests to a file and the controller sums them; what a module fixture
starts is counted in the test during which it was reaped, and a child that was killed and never reaped is
not counted.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

_RECORDS_ENV = "TPU_TOOLS_CPU_REPORT_DIR"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", type=int, default=25, metavar="N",
                     help="rows of the CPU report: the N most expensive files and tests (pytest_cpu_report)")
    parser.addoption("--cpu-report-json", metavar="FILE", default=None,
                     help="also write every test's record to FILE, one JSON object a line (pytest_cpu_report)")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) owns the folder
        folder = tempfile.mkdtemp(prefix="tpu-tools-cpu-")
        os.environ[_RECORDS_ENV] = folder  # inherited by xdist's workers, started after this hook
        config.stash[_FOLDER] = Path(folder)


_FOLDER = pytest.StashKey[Path]()


def _cpu_s() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    own_before, children_before = _cpu_s()
    started = time.monotonic()
    yield
    own_after, children_after = _cpu_s()
    record = {"test": item.nodeid, "own_s": own_after - own_before, "children_s": children_after - children_before,
              "wall_s": time.monotonic() - started}
    with open(Path(os.environ[_RECORDS_ENV]) / f"{os.getpid()}.jsonl", "a") as records:
        records.write(json.dumps(record) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is None:
        return
    records = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    rows = config.getoption("cpu_report")
    write = terminalreporter.write_line
    total = sum(r["own_s"] + r["children_s"] for r in records)
    in_children = sum(r["children_s"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    terminalreporter.section("CPU time per test (own + reaped children)")
    write(f"{len(records)} tests: {total:.1f} s of CPU, of which {in_children:.1f} s in child processes; "
          f"wall time summed over tests {wall:.1f} s")
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for record in records:
        entry = files[record["test"].split("::")[0]]
        entry[0] += record["own_s"] + record["children_s"]
        entry[1] += record["wall_s"]
        entry[2] += 1
    write(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file")
    for name, (cpu, wall, count) in sorted(files.items(), key=lambda item: -item[1][0])[:rows]:
        write(f"{cpu:8.1f} {wall:8.1f} {count:6d}  {name}")
    write(f"{'CPU s':>8} {'wall s':>8}  test")
    for record in sorted(records, key=lambda r: -(r["own_s"] + r["children_s"]))[:rows]:
        write(f"{record['own_s'] + record['children_s']:8.1f} {record['wall_s']:8.1f}  {record['test']}")
    keep = config.getoption("cpu_report_json")
    if keep:
        Path(keep).write_text("".join(json.dumps(record) + "\n" for record in records))
    for path in folder.glob("*.jsonl"):
        path.unlink()
    folder.rmdir()
