"""Every failure is one line on stderr, `PROG: error: ...`; a program asked for JSON also answers it in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool

# --- one line, naming the program as invoked -------------------------------------------------------------

@pytest.mark.parametrize(("args", "prog", "fragment"), [
    (["tpu-monitor", "--period", "١s"], "tpu-monitor", "--period"),
    (["tpu-tools", "monitor", "--bogus"], "tpu-tools monitor", "--bogus"),
    (["tpu-tools", "nope"], "tpu-tools", "nope"),
    (["tpu-ls", "--platform", "nope"], "tpu-ls", "--platform"),
    (["tpu-tools", "ls", "--timeout"], "tpu-tools ls", "--timeout"),
    (["tpu-top", "--once", "--bogus"], "tpu-top", "--bogus"),
    (["tpu-profile", "cache", "gc"], "tpu-profile", "DIR"),
    (["tpu-tools", "profile", "cache", "inspect", "a", "b"], "tpu-tools profile", "extra argument"),
    (["tpu-bench", "matmul", "--size", "x"], "tpu-bench", "--size"),
    (["tpu-dump", "--only", ""], "tpu-dump", "--only"),
    (["tpu-diag", "-r", "7"], "tpu-diag", "level"),
    (["tpu-collectives-test", "-b", "lots"], "tpu-collectives-test", "lots"),
])
def test_a_usage_error_is_one_line_naming_the_program(args, prog, fragment):
    result = run_tool(args[0], *args[1:], env=clean_env(JAX_PLATFORMS="cpu"), timeout=60)
    message = assert_one_line_error(result, 2, fragment)
    assert message.startswith(f"{prog}: error: "), message
    assert result.stdout == ""


def test_a_group_given_nothing_still_shows_its_help():
    result = run_tool("tpu-profile", env=clean_env(), timeout=60)
    assert result.returncode == 2
    assert "Commands:" in result.stderr
    assert "cache" in result.stderr


# --- --json on a failure path ---------------------------------------------------------------------------

# {bundle}: not a bundle; {file}: a regular file where a directory belongs; {missing}: nothing there
FAILURES = [
    (["tpu-ls", "--json", "--platform", "tpu"], "tpu-tools/ls/v1"),
    (["tpu-ls", "--json", "--timeout", "x"], "tpu-tools/ls/v1"),  # a usage error after --json
    (["tpu-ls", "--format", "json", "--bogus"], "tpu-tools/ls/v1"),
    (["tpu-diag", "--platform", "tpu", "--json"], "tpu-tools/diag/v1"),
    (["tpu-diag", "--platform", "cpu", "--xla-flag=--xla_no_such_flag=1", "--json"], "tpu-tools/diag/v1"),
    (["tpu-profile", "cache", "inspect", "{file}", "--json"], "tpu-tools/cache/v1"),
    (["tpu-profile", "cache", "verify", "{file}", "--json"], "tpu-tools/cache-verify/v1"),
    (["tpu-profile", "cache", "gc", "{file}", "--json"], "tpu-tools/cache-gc/v1"),
    (["tpu-profile", "cache", "warm", "{missing}", "no_such_module_here:f", "--json"], "tpu-tools/cache-warm/v1"),
    (["tpu-profile", "summary", "{missing}", "--json"], "tpu-tools/profile/v1"),
    (["tpu-profile", "hlo", "--json", "--arg", "f32[x]", "m:f"], "tpu-tools/profile-hlo/v1"),
    (["tpu-dump", "show", "{bundle}", "--json"], "tpu-tools/dump-show/v1"),
    (["tpu-bench", "compare", "{missing}", "{missing}", "--format", "json"], "tpu-tools/bench-compare/v1"),
    (["tpu-bench", "matmul", "--json", "-", "--size", "x"], "tpu-tools/bench/v1"),
    (["tpu-collectives-test", "--json", "-", "--devices", "x"], "tpu-tools/collectives/v1"),
]


@pytest.mark.parametrize(("args", "schema"), FAILURES, ids=[" ".join(args[:3]) for args, _ in FAILURES])
def test_a_failure_asked_for_json_prints_one_document_with_its_error(tmp_path: Path, args, schema):
    (tmp_path / "bundle.tar.gz").write_bytes(b"not a bundle")
    (tmp_path / "file").write_text("x")
    places = {"bundle": tmp_path / "bundle.tar.gz", "file": tmp_path / "file", "missing": tmp_path / "missing"}
    args = [arg.format(**places) for arg in args]
    result = run_tool(args[0], *args[1:], env=clean_env(JAX_PLATFORMS="cpu"), timeout=120, cwd=tmp_path)
    assert result.returncode not in (0, 141), (result.returncode, result.stderr)
    message = assert_one_line_error(result, result.returncode)
    document = json.loads(result.stdout)  # one document: json.loads refuses a second one after it
    assert document == {"schema": schema, "error": document["error"], "exit_code": result.returncode}
    assert document["error"]
    assert message.split(": error: ", 1)[1].startswith(document["error"])


def test_a_failure_without_json_prints_nothing_on_stdout(tmp_path: Path):
    result = run_tool("tpu-dump", "show", str(tmp_path), env=clean_env(), timeout=60)
    assert_one_line_error(result, 2)
    assert result.stdout == ""


def test_a_document_the_command_wrote_is_not_followed_by_another(tmp_path: Path):
    """A failed collectives run writes its own document (its keys, status failed): no second one after it."""
    result = run_tool("tpu-collectives-test", "--json", "-", "--platform", "tpu", env=clean_env(), timeout=120)
    assert_one_line_error(result, 1, "tpu platform is not available")
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/collectives/v1"
    assert document["status"] == "failed"
    assert document["exit_code"] == 1
    assert "tests" in document
