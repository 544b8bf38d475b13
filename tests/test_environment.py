"""Every environment variable the code reads is declared once (tpu_tools/environment.py), and the man pages,
docs/environment.md and `tpu-tools --help` are made from the declarations and the command table."""

from __future__ import annotations

import ast
import re
import tomllib

from conftest import REPO, run_tool

from tpu_tools.environment import BY_NAME, PROGRAMS, VARIABLES

OURS = re.compile(r"^TPU_TOOLS_[A-Z0-9_]+$")


def _names_in_code() -> dict[str, list[str]]:
    """{TPU_TOOLS_* name: files} for every string constant of the package that is exactly such a name."""
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "tpu_tools").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and OURS.match(node.value):
                found.setdefault(node.value, []).append(str(path.relative_to(REPO)))
    return found


def test_every_variable_the_code_reads_is_declared_and_every_declared_one_is_read():
    in_code = _names_in_code()
    undeclared = {name: files for name, files in in_code.items() if name not in BY_NAME}
    assert not undeclared, f"declare these in tpu_tools/environment.py: {undeclared}"
    declared = {v.name for v in VARIABLES if OURS.match(v.name)}
    assert declared - set(in_code) == set(), "declared but read nowhere"
    assert len(BY_NAME) == len(VARIABLES)  # each once


def test_every_variable_the_docs_name_is_declared():
    named = {name for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
             for name in re.findall(r"\bTPU_TOOLS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())}
    test_only = {name for name in named if name.startswith("TPU_TOOLS_TEST_")}  # the suite's own switches
    assert named - test_only - set(BY_NAME) == set()


def test_each_man_page_lists_the_variables_its_program_reads():
    for program in PROGRAMS:
        page = (REPO / "man" / f"{program}.1").read_text()
        section = page.split(".SH ENVIRONMENT\n", 1)[1].split(".SH ", 1)[0]
        listed = {line.split()[0] for line in section.splitlines() if line and not line.startswith(".")}
        assert listed == {v.name for v in VARIABLES if v.read_by(program)}, program
    group = (REPO / "man" / "tpu-tools.1").read_text()
    assert all(v.name in group for v in VARIABLES if not v.internal)
    assert "TPU_TOOLS_GCE_METADATA_URL" in group
    assert "TPU_TOOLS_SERVICEACCOUNT_DIR" in group


def test_the_group_help_names_every_program():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    programs = sorted(name for name in scripts if name != "tpu-tools")
    assert sorted(PROGRAMS) == programs
    result = run_tool("tpu-tools", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    named = re.search(r"installed as its own program: ([^.]+)\.", text)
    assert named
    assert sorted(named.group(1).split(", ")) == programs
