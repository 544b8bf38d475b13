"""Python frames as JAX's profiler names them, and whether a frame is the user's code or a library's.

The profiler's Python tracer records one event per Python call, named
"$<file basename>:<first line of the function> <function name>". The file is a
basename only, so "is this the user's code?" is answered by the set of file
names that libraries (the standard library, site-packages, this toolkit) ship.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from dataclasses import dataclass

_FRAME = re.compile(r"^\$(?P<file>[^ ]+?):(?P<line>\d+) (?P<function>.+)$")


@dataclass(frozen=True)
class Frame:
    file: str  # basename, as the trace has it
    line: int  # first line of the function
    function: str

    @property
    def label(self) -> str:
        if self.function == "<module>":
            return f"top level of {self.file}"
        return f"{self.function} ({self.file}:{self.line})"


def parse_frame(event_name: str) -> Frame | None:
    """The frame of a Python-tracer event name, or None for builtins and unknown code."""
    match = _FRAME.match(event_name)
    if not match:
        return None
    return Frame(match["file"], int(match["line"]), match["function"])


def _library_roots() -> list[str]:
    paths = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tpu_tools itself
    roots = sorted(p for p in paths if p and os.path.isdir(p))
    # Drop roots nested in another root (the venv's lib/pythonX.Y holds its site-packages).
    return [r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots)]


@functools.lru_cache(maxsize=1)
def library_file_names() -> frozenset[str]:
    """Basenames of the Python files that libraries and the standard library ship."""
    names: set[str] = set()
    for root in _library_roots():
        for _folder, _dirs, files in os.walk(root):
            names.update(f for f in files if f.endswith(".py"))
    return frozenset(names)


def loaded_user_file_names() -> frozenset[str]:
    """Basenames of the modules this process loaded from outside the library folders (the user's code)."""
    roots = tuple(root + os.sep for root in _library_roots())
    names = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and not os.path.abspath(path).startswith(roots):
            names.add(os.path.basename(path))
    return frozenset(names)


@dataclass(frozen=True)
class FrameClassifier:
    """Tells user frames from library frames; `user_files` wins over the library list."""

    user_files: frozenset[str] = frozenset()

    def is_user(self, frame: Frame | None) -> bool:
        if frame is None:
            return False
        if frame.file in self.user_files:
            return True
        return frame.file not in library_file_names()
