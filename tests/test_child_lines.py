"""The line recorder the suite gives the programs it starts (tests/child_lines.py) against coverage itself.

A sample program (a second module, a thread, a forked child leaving through os._exit, a branch never taken)
runs once under coverage (`coverage run`, the sysmon core, `patch = fork, _exit`) and once under the recorder,
started the way the suite starts it (its `.pth` file in a site directory): both must report the same lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import child_coverage
import child_lines
import pytest
from conftest import UNMEASURED, clean_env

PROGRAM = '''\
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import helper


def in_thread(out):
    out.append(helper.square(3))


def main():
    child = os.fork()
    if child == 0:
        helper.in_child()
        os._exit(0)
    os.waitpid(child, 0)
    out = []
    thread = threading.Thread(target=in_thread, args=(out,))
    thread.start()
    thread.join()
    if out == [9]:
        print("thread ran")
    else:
        print("never printed")
    if sys.argv[1:] == ["wait"]:
        # the joined thread's OS thread may still be ending: a signal it took would leave the main thread in
        # its read, never running the handler
        while len(os.listdir("/proc/self/task")) > 1:
            threading.Event().wait(0.001)
        print("ready", flush=True)
        sys.stdin.read()
    return helper.Shape(2).area()


if __name__ == "__main__":
    sys.exit(main() - 4)
'''

HELPER = '''\
class Shape:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side * self.side


def square(x):
    return x * x


def in_child():
    value = square(4)
    return value


def never_called():
    return 1
'''


def line_of(text: str, fragment: str) -> int:
    (number,) = [number for number, line in enumerate(text.splitlines(), 1) if fragment in line]
    return number


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "prog.py").write_text(PROGRAM)
    (source / "helper.py").write_text(HELPER)
    return source


def run_recorded(tmp_path: Path, source: Path, *args: str, record_into: Path | None = None,
                 **popen: object) -> subprocess.Popen[str]:
    """The sample under the recorder, started as in the suite: by its .pth file, read from a site directory."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    assert child_coverage.install(site)
    directory = record_into or tmp_path / "lines"
    if record_into is None:
        directory.mkdir(exist_ok=True)
    program = source / "prog.py"
    starter = (f"import site, sys, runpy; site.addsitedir({str(site)!r}); "
               f"sys.argv = [{str(program)!r}, *sys.argv[1:]]; runpy.run_path({str(program)!r}, run_name='__main__')")
    env = clean_env(**{**UNMEASURED, child_lines.RECORD_VARIABLE: f"{directory}{os.pathsep}{source}"})
    # SIGHUP at its default action, as in a terminal, even in a suite started under `nohup`
    command = ["env", "--default-signal=HUP", sys.executable, "-c", starter, *args]
    return subprocess.Popen(command, env=env, text=True, **popen)  # type: ignore[call-overload]


def lines_under_coverage(tmp_path: Path, source: Path) -> dict[str, set[int]]:
    from coverage import CoverageData

    config = tmp_path / "coverage.toml"
    config.write_text(textwrap.dedent(f"""\
        [tool.coverage.run]
        source = [{str(source)!r}]
        patch = ["fork", "_exit"]
        parallel = true
        data_file = {str(tmp_path / "data" / ".coverage")!r}
        """))
    (tmp_path / "data").mkdir()
    env = clean_env(**UNMEASURED, COVERAGE_CORE="sysmon")
    result = subprocess.run([sys.executable, "-m", "coverage", "run", f"--rcfile={config}", str(source / "prog.py")],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines: dict[str, set[int]] = {}
    for path in (tmp_path / "data").glob(".coverage.*"):
        data = CoverageData(str(path))
        data.read()
        for filename in data.measured_files():
            lines.setdefault(filename, set()).update(data.lines(filename) or ())
    return lines


def test_the_recorder_sees_the_lines_coverage_sees(tmp_path, sample):
    expected = lines_under_coverage(tmp_path, sample)
    program = run_recorded(tmp_path, sample, stdout=subprocess.PIPE)
    out, _ = program.communicate(timeout=60)
    assert (program.returncode, out) == (0, "thread ran\n")
    recorded = child_coverage.recorded_lines(str(tmp_path / "lines"))
    assert set(recorded) == set(expected) == {str(sample / "prog.py"), str(sample / "helper.py")}
    helper, prog = str(sample / "helper.py"), str(sample / "prog.py")
    assert recorded[helper] == expected[helper]
    assert {line_of(HELPER, "value = square(4)"), line_of(HELPER, "return value")} <= recorded[helper]  # the child's
    assert line_of(HELPER, "return 1") not in recorded[helper]  # never_called's body
    # Coverage loses what a forked child runs in a function that was already running at the fork (its data is
    # made anew in the child, where that function still adds to the old); the recorder keeps it.
    assert recorded[prog] == expected[prog] | {line_of(PROGRAM, "helper.in_child()"), line_of(PROGRAM, "os._exit(0)")}
    # two processes, two files: the forked child saved on its way out through os._exit
    assert len(list((tmp_path / "lines").glob("lines.*.json"))) == 2


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_program_ended_by_a_signal_keeps_its_lines_and_dies_of_it(tmp_path, sample, number):
    program = run_recorded(tmp_path, sample, "wait", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert program.stdout is not None
    assert program.stdout.readline() == "thread ran\n"
    assert program.stdout.readline() == "ready\n"
    program.send_signal(number)
    program.wait(timeout=30)
    assert program.returncode == -number
    recorded = child_coverage.recorded_lines(str(tmp_path / "lines"))
    assert line_of(PROGRAM, 'print("ready"') in recorded[str(sample / "prog.py")]  # run before the signal came


def test_a_recorder_that_cannot_write_leaves_the_program_as_it_was(tmp_path, sample):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    program = run_recorded(tmp_path, sample, record_into=not_a_directory, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    assert program.communicate(timeout=60) == ("thread ran\n", "")
    assert program.returncode == 0
    assert not_a_directory.read_text() == ""


def test_merged_lines_are_coverage_data_without_the_omitted_files(tmp_path):
    from coverage import CoverageData

    directory = tmp_path / "lines"
    directory.mkdir()
    (directory / "lines.1.a.json").write_text(json.dumps({"/src/a.py": [1, 2], "/src/gen_pb2.py": [1]}))
    (directory / "lines.2.b.json").write_text(json.dumps({"/src/a.py": [2, 5], "/src/b.py": [3]}))
    (directory / "lines.3.c.json.partial").write_text('{"/src/c.py": [1')  # a writer killed mid-way
    assert child_coverage.merge(str(directory), str(tmp_path / ".coverage"), ["*_pb2.py"]) == 2
    assert not directory.exists()
    (written,) = tmp_path.glob(".coverage.children.*")
    data = CoverageData(str(written))
    data.read()
    assert {name: sorted(data.lines(name) or ()) for name in data.measured_files()} == {
        "/src/a.py": [1, 2, 5], "/src/b.py": [3]}


def test_install_writes_once_and_says_when_it_cannot(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    assert child_coverage.install(site)
    written = {path.name: path.stat().st_mtime_ns for path in site.iterdir()}
    assert set(written) == {f"{child_coverage.MODULE}.py", f"{child_coverage.MODULE}.pth"}
    assert child_coverage.install(site)
    assert {path.name: path.stat().st_mtime_ns for path in site.iterdir()} == written  # unchanged: not rewritten
    assert not child_coverage.install(tmp_path / "no-such-directory")


def test_children_of_a_measured_session_record_instead_of_starting_coverage(pytestconfig):
    if not pytestconfig.option.cov_source or pytestconfig.option.no_cov:
        pytest.skip("the session measures no coverage (run with --cov)")
    assert child_lines.RECORD_VARIABLE in os.environ
    assert child_coverage.COVERAGE_CHILD_VARIABLE not in os.environ
