"""Man pages and completions are generated from the click tree and must not go stale."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib

import pytest
from conftest import REPO
from programs import require_program


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_checked_in_docs_match_the_code():
    stale = _gen_docs().stale_files()
    assert not stale, f"regenerate with `python tools/gen_docs.py`: {[str(p) for p in stale]}"


def test_every_command_has_a_console_script_and_a_man_page():
    from tpu_tools.cli.main import COMMANDS

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tpu-tools"] == "tpu_tools.cli.main:main"
    # tpu-ls's entry starts its runtime child before importing the command (tpu_tools/cli/ls_start.py)
    entries = {"ls": "tpu_tools.cli.ls_start"}
    for name, target in COMMANDS.items():
        module, _, attribute = target.partition(":")
        assert scripts[f"tpu-{name}"] == f"{entries.get(name, module)}:main"
        assert (REPO / "man" / f"tpu-{name}.1").exists()
        imported = importlib.import_module(module)
        assert getattr(imported, attribute).name == name


def test_man_pages_render_without_warnings():
    if not shutil.which("groff"):
        pytest.skip("groff is not installed")
    for page in sorted((REPO / "man").glob("*.1")):
        result = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(page)], capture_output=True, text=True)
        assert result.returncode == 0, (page.name, result.stderr)
        assert not result.stderr.strip(), (page.name, result.stderr)


@pytest.mark.parametrize(("shell", "file"), [("bash", "tpu-tools.bash"), ("zsh", "_tpu-tools"),
                                             ("fish", "tpu-tools.fish")])
def test_completions_are_valid_shell(shell, file):
    require_program(shell)
    result = subprocess.run([shell, "-n", str(REPO / "completions" / file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_bash_completion_offers_subcommands_options_and_choices():
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    script = f"""
        source {REPO / 'completions' / 'tpu-tools.bash'}
        COMP_WORDS=(tpu-tools ''); COMP_CWORD=1; _tpu_tools_complete; echo "subs: ${{COMPREPLY[*]}}"
        COMP_WORDS=(tpu-ls --plat); COMP_CWORD=1; _tpu_tools_complete; echo "opts: ${{COMPREPLY[*]}}"
        COMP_WORDS=(tpu-tools ls --platform ''); COMP_CWORD=3; _tpu_tools_complete; echo "choices: ${{COMPREPLY[*]}}"
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.splitlines()
    from tpu_tools.cli.main import COMMANDS

    assert set(out[0].split()[1:]) == set(COMMANDS)
    assert out[1] == "opts: --platform"
    assert out[2] == "choices: auto cpu gpu cuda rocm tpu"


def test_every_command_and_subcommand_answers_dash_h():
    import click
    from click.testing import CliRunner

    from tpu_tools.cli.main import cli

    def walk(command: click.Command, path: list[str]):
        yield path
        if isinstance(command, click.Group):
            context = click.Context(command, **command.context_settings)
            for name in command.list_commands(context):
                yield from walk(command.get_command(context, name), [*path, name])

    paths = list(walk(cli, []))
    assert ["bench", "matmul"] in paths
    assert ["dump", "show"] in paths
    assert ["profile", "run"] in paths
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli, [*path, "-h"], prog_name="tpu-tools")
        assert result.exit_code == 0, (path, result.output)
        assert result.output.startswith("Usage: tpu-tools"), (path, result.output)
