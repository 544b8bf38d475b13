"""A test whose program is missing is skipped on a developer's machine and fails in CI (tests/programs.py), and
tools/test.sh stops in CI when it cannot install the programs; run on a small suite and a PATH of their own."""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO, TESTS

pytest_plugins = ["pytester"]

INNER_TESTS = f"""
import sys

sys.path.insert(0, {str(TESTS)!r})
from programs import needs, require_program


def test_terminal():
    require_program("tmux")


@needs("promtool")
def test_rules(tmp_path):
    assert tmp_path.exists()
"""


def _run(pytester, monkeypatch, ci: str | None):
    monkeypatch.setenv("PATH", str(pytester.path / "nothing-here"))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-rsf")


def test_a_missing_program_skips_its_tests_outside_ci(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, None)
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*tmux is not installed (tools/test.sh installs it)*"])


def test_in_ci_a_missing_program_fails_its_tests(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*promtool is not installed*in CI (CI=true) a missing program fails the run*"])


def test_the_test_script_stops_in_ci_when_it_cannot_install_them(tmp_path):
    # A PATH with bash and the few tools the script's start uses, but none of the programs: not root, so
    # nothing can be installed, and the script must stop before it builds anything.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "id", "env"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    copy = tmp_path / "repo"
    (copy / "tools").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "test.sh", copy / "tools" / "test.sh")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "CI": "true"}
    result = subprocess.run([str(bin_dir / "bash"), str(copy / "tools" / "test.sh")], env=env, capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.strip().endswith("(CI=true)")
    assert "could not install tmux zsh fish prometheus" in result.stderr
    assert not (copy / ".venv").exists()
    outside = subprocess.run([str(bin_dir / "bash"), str(copy / "tools" / "test.sh")], env={**env, "CI": ""},
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "could not install tmux zsh fish prometheus gcc promtool; the tests that need them are skipped" in \
        outside.stdout  # outside CI it goes on (and here stops later, finding no Python on this PATH)
