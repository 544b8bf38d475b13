"""Coverage of the programs the tests start, through tests/child_lines.py instead of coverage's start-up in each.

The session's main process (xdist's controller, or the one process of `-n 0`) installs the recorder into the
test environment and makes the directory the programs write into; each process that runs tests (a worker)
then gives its children the recorder in place of coverage's own subprocess start-up. Before pytest-cov combines
the data, the recorded lines become one coverage data file beside the others. Where the recorder cannot be
installed (a read-only site-packages, Python before 3.12), the children keep coverage's own start-up, as before.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import child_lines

MODULE = "tpu_tools_test_lines"
# the line a .pth file runs at every interpreter start: inert unless the environment asks for the recorder
PTH_LINE = f'import os; "{child_lines.RECORD_VARIABLE}" in os.environ and __import__("{MODULE}").start()\n'
DIRECTORY_VARIABLE = "TPU_TOOLS_TEST_CHILD_LINES"  # set by the main process; workers' children record into it
COVERAGE_CHILD_VARIABLE = "COVERAGE_PROCESS_CONFIG"  # what coverage's `patch = subprocess` gives children


def install(site_packages: Path | None = None) -> bool:
    """Put the recorder and its .pth file into site-packages (when changed); False where that is not writable, or
    where the interpreter has no sys.monitoring (before 3.12): the children then start coverage themselves."""
    if not hasattr(sys, "monitoring"):
        return False
    site = site_packages or Path(sysconfig.get_path("purelib"))
    wanted = {site / f"{MODULE}.py": Path(child_lines.__file__).read_text(encoding="utf-8"),
              site / f"{MODULE}.pth": PTH_LINE}
    try:
        for path, text in wanted.items():
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                partial = path.with_name(f".{path.name}.{os.getpid()}")
                partial.write_text(text, encoding="utf-8")
                os.replace(partial, path)
    except OSError:
        return False
    return True


def make_directory() -> str:
    """A directory for the children's files, named in the environment the workers inherit."""
    directory = tempfile.mkdtemp(prefix="tpu-tools-child-lines-")
    os.environ[DIRECTORY_VARIABLE] = directory
    return directory


def record_children(source: Path) -> None:
    """In a process that runs tests: its children record their lines of SOURCE instead of starting coverage."""
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if directory:
        os.environ[child_lines.RECORD_VARIABLE] = directory + os.pathsep + os.path.realpath(source)
        os.environ.pop(COVERAGE_CHILD_VARIABLE, None)


def recorded_lines(directory: str) -> dict[str, set[int]]:
    """The union of every file the children wrote (a file cut short by a killed writer was never renamed)."""
    return _union(_line_files(directory))


def merge(directory: str, data_file: str, omit: list[str]) -> int:
    """Write the children's lines as a coverage data file beside DATA_FILE, for coverage to combine; remove the
    directory. Returns how many files of lines there were."""
    from coverage import CoverageData

    files = _line_files(directory)
    lines = {filename: sorted(numbers) for filename, numbers in _union(files).items()
             if not any(fnmatch.fnmatch(filename, pattern) for pattern in omit)}
    if lines:
        data = CoverageData(basename=data_file, suffix=f"children.{os.getpid()}")
        data.add_lines(lines)
        data.write()
    shutil.rmtree(directory, ignore_errors=True)
    return len(files)


def _line_files(directory: str) -> list[Path]:
    return list(Path(directory).glob("lines.*.json"))


def _union(files: list[Path]) -> dict[str, set[int]]:
    lines: dict[str, set[int]] = {}
    for path in files:
        for filename, numbers in json.loads(path.read_text(encoding="utf-8")).items():
            lines.setdefault(filename, set()).update(numbers)
    return lines
