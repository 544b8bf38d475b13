"""An empty path ('' from an unset shell variable) is refused by every command and option that takes a path.

Click and pathlib read '' as '.', the current folder: `tpu-profile cache gc "$UNSET"` worked on it, and
`--cache-dir ""` put a benchmark's caches there. Each case runs in a folder of its own that must be left as it
was; the click tree is walked so that a path option added later without the shared type fails here too.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from conftest import assert_one_line_error, clean_env, run_tool

from tpu_tools.cli.main import cli
from tpu_tools.cli.params import PathParam

CASES = [
    ("tpu-profile", "cache", "inspect", ""),
    ("tpu-profile", "cache", "doctor", ""),
    ("tpu-profile", "cache", "verify", ""),
    ("tpu-profile", "cache", "gc", ""),
    ("tpu-profile", "cache", "gc", "", "--max-bytes", "0"),
    ("tpu-profile", "cache", "warm", "", "train"),
    ("tpu-profile", "cache", "warm", "cache", "--", ""),
    ("tpu-profile", "run", "--", ""),
    ("tpu-profile", "run", "--out", "", "--", "x.py"),
    ("tpu-profile", "summary", ""),
    ("tpu-dump", "--output", ""),
    ("tpu-dump", "--add", ""),
    ("tpu-dump", "show", ""),
    ("tpu-monitor", "--config", ""),
    ("tpu-monitor", "--web-config", " "),
    ("tpu-collectives-test", "--json", ""),
    ("tpu-bench", "--json", ""),
    ("tpu-bench", "--junit", ""),
    ("tpu-bench", "--baseline", ""),
    ("tpu-bench", "--cache-dir", ""),
    ("tpu-bench", "compare", "", "current.json"),
    ("tpu-bench", "compare", "baseline.json", ""),
    ("tpu-diag", "--junit", ""),
    ("tpu-tools", "profile", "cache", "gc", ""),
]
# Names that say a parameter is a file or a folder (metavars and destinations).
PATH_METAVARS = {"FILE", "PATH", "DIR", "[DIR]", "BUNDLE", "BASELINE.json", "CURRENT.json", "DIRECTORY"}
PATH_NAMES = ("path", "paths", "dir", "file", "directory", "bundle", "output")
NOT_PATHS = {"directions"}  # tpu-bench transfer --direction DIR: h2d, d2h, d2d


@pytest.mark.parametrize("args", CASES, ids=[" ".join(w if w.strip() else "EMPTY" for w in a) for a in CASES])
def test_an_empty_path_is_a_usage_error_that_touches_nothing(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("precious\n")
    before = sorted(p.name for p in home.iterdir())
    result = run_tool(*args, cwd=home, env=clean_env(JAX_PLATFORMS="cpu", HOME=str(home)), timeout=60)
    assert_one_line_error(result, 2, "must not be empty")
    assert sorted(p.name for p in home.iterdir()) == before


def test_an_empty_cache_variable_is_refused_like_no_variable(tmp_path: Path) -> None:
    result = run_tool("tpu-profile", "cache", "doctor", cwd=tmp_path,
                      env=clean_env(JAX_COMPILATION_CACHE_DIR="  "))
    assert_one_line_error(result, 2, "JAX_COMPILATION_CACHE_DIR")


def _walk(command: click.Command, trail: str) -> list[tuple[str, click.Parameter]]:
    found = [(trail, param) for param in command.params]
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=trail, **command.context_settings)  # its -h, as the program has
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                found += _walk(sub, f"{trail} {name}")
    return found


def test_every_path_parameter_of_every_program_refuses_empty() -> None:
    params = _walk(cli, "tpu-tools")
    assert len(params) > 100  # the whole tree was walked
    path_like = []
    for trail, param in params:
        metavar = param.metavar or ""
        named = (param.name or "").lower()
        is_path = (isinstance(param.type, click.Path) or metavar in PATH_METAVARS
                   or any(named == n or named.endswith(f"_{n}") for n in PATH_NAMES))
        if not is_path or getattr(param, "is_flag", False) or param.name in NOT_PATHS:
            continue
        path_like.append(f"{trail} {param.name}")
        assert isinstance(param.type, PathParam), f"{trail} {param.name} takes a path without PathParam"
    # each program's paths, as listed in the module's CASES
    assert len(path_like) >= 20, path_like
