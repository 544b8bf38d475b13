"""The views read typed records: no figure through a dict lookup (`x.get("name")`, `x["name"]`).

Figures travel from where they are read to every view as records (tpu_tools/metrics/records and the
features' own records), one name per figure. A view that looks a figure up by its name in a dict brings back
what the records removed: a figure spelled differently in each view, and a rename that misses one. This test
counts such lookups in every view file (tpu-top, the renderers, the exposition, the dump's findings, the fleet
view) and holds each file to the count below: a new lookup fails it, and a file that loses lookups must lower
its count here (the table only goes down). What stays is a map that is a map: Prometheus labels, environment
variables, libtpu's metrics by their own names, a cause of badput to its seconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_tools

PACKAGE = Path(tpu_tools.__file__).resolve().parent
VIEW_GLOBS = ("top/*.py", "render/*.py", "exporter/*.py", "dump/findings.py")

# file (relative to tpu_tools/) -> the dict lookups by name it may hold, each a map that is a map (see above)
ALLOWED: dict[str, int] = {
    "exporter/prometheus.py": 2,  # a Prometheus sample's labels
    "exporter/webserver.py": 8,  # an HTTP request's headers
    "exporter/webconfig.py": 8,  # the sections of a --web-config YAML file, checked key by key as it is read
    "top/history.py": 7,  # a graph's series by the figure they plot
    "render/bench_view.py": 1,  # a case's parameters as the user gave them
}


def dict_lookups(source: str) -> list[int]:
    """The lines of every lookup by a literal name: `.get("name", ...)` and `[ "name" ]` reads."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            lines.append(node.lineno)
    return sorted(lines)


def view_files() -> list[Path]:
    return sorted({path for pattern in VIEW_GLOBS for path in PACKAGE.glob(pattern) if path.name != "__init__.py"})


def test_the_counter_sees_both_kinds_of_lookup_and_nothing_else():
    source = 'a = d.get("x")\nb = d["y"]\nc = d.get(key)\nd["z"] = 1\ne = record.figure\nf = d[0]\n'
    assert dict_lookups(source) == [1, 2]


def test_no_view_reads_a_figure_through_a_dict_lookup():
    counts = {str(path.relative_to(PACKAGE)): dict_lookups(path.read_text()) for path in view_files()}
    over = {name: lines for name, lines in counts.items() if len(lines) > ALLOWED.get(name, 0)}
    assert not over, "dict lookups by name in views (read the record's attribute instead): " + "; ".join(
        f"{name}: {len(lines)} > {ALLOWED.get(name, 0)} at lines {lines[:12]}" for name, lines in over.items())
    tightened = {name: len(counts.get(name, [])) for name, allowed in ALLOWED.items()
                 if len(counts.get(name, [])) < allowed}
    assert not tightened, f"views with fewer lookups than allowed: lower their counts in ALLOWED to {tightened}"
