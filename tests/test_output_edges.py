"""Where output meets its reader: a closed pipe, and terminals too narrow for every column."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sysroot
from conftest import clean_env, run_tool, tool_command
from programs import require_program
from test_top import Tmux

from tpu_tools.parsing import MAX_COLUMNS, MAX_LINES, terminal_size
from tpu_tools.render.table import Column, TableData, columns_that_fit, rich_table

CLOSED_PIPE = 141


def _with_closed_stdout(program: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run with a stdout whose reader is already gone: every write meets a closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*tool_command(program), *args], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=120)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("pipe")
    path = base / "b.tar.gz"
    result = run_tool("tpu-dump", "--only", "system.os,system.cpu", "-o", str(path))
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.parametrize("command", [
    ("tpu-ls", "--no-runtime"),
    ("tpu-monitor", "--count", "1"),
    ("tpu-top", "--once"),
    ("tpu-dump", "show", "BUNDLE"),
    ("tpu-dump", "show", "BUNDLE", "--file", "manifest.json"),
    ("tpu-bench", "--help"),
    ("tpu-profile", "--help"),
    ("tpu-collectives-test", "--help"),
    ("tpu-tools", "--version"),
])
def test_every_command_ends_quietly_with_141_on_a_closed_pipe(command, bundle, tmp_path):
    program, *args = command
    args = [str(bundle) if a == "BUNDLE" else a for a in args]
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    result = _with_closed_stdout(program, *args, env=env)
    if result.returncode == 2 and "No such option" in result.stderr:
        pytest.fail(result.stderr)
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")


def test_a_pipe_closed_midway_ends_the_monitor_with_141(tmp_path):
    command = " ".join(tool_command("tpu-monitor")) + " --period 0.1 | head -n 1"
    result = subprocess.run(["bash", "-c", f"{command}; echo status ${{PIPESTATUS[0]}} >&2"], capture_output=True,
                            text=True, env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(tmp_path)), timeout=60)
    assert result.stdout.startswith("{")
    assert result.stderr == f"status {CLOSED_PIPE}\n"


# -- narrow terminals -----------------------------------------------------------------------------------------

def _table() -> TableData:
    table = TableData([Column("PID", "right"), Column("USER"), Column("DEVICE MEMORY", "right", priority=2),
                       Column("UTILIZATION", "right", priority=1), Column("COMMAND")])
    table.add_row(1234, "alice", "12.5 GiB", "45.0%", "python3 train.py --steps 100")
    return table


def test_columns_are_dropped_lowest_priority_first_and_the_first_always_stays():
    table = _table()
    assert columns_that_fit(table, 200) == [0, 1, 2, 3, 4]
    assert columns_that_fit(table, 40) == [0, 1, 2, 3]  # COMMAND goes first (priority 0, rightmost)
    assert columns_that_fit(table, 35) == [0, 2, 3]  # then USER (priority 0)
    assert columns_that_fit(table, 20) == [0, 2]  # then UTILIZATION (priority 1)
    assert columns_that_fit(table, 1) == [0]


@pytest.mark.parametrize("width", [20, 30, 40, 60, 80])
def test_no_header_word_is_ever_broken(width):
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True).print(rich_table(_table(), width))
    words = buffer.getvalue().split()
    shown = [c.header for c in _table().columns if c.header.split()[0] in words]
    assert shown
    assert all(word in words for header in shown for word in header.split())
    if len(shown) < 5:
        assert "(not shown at this width:" in " ".join(words)


def test_tpu_ls_in_a_40_column_terminal(tmp_path):
    require_program("tmux")
    sysroot.v5e_host(tmp_path / "root", holders={3001: [0]})
    bin_dir = str(Path(tool_command("tpu-ls")[0]).parent)
    env = clean_env(TERM="xterm-256color")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    tmux = Tmux(40, 50, env)
    try:
        tmux.keys(f"clear; TPU_TOOLS_SYSROOT={tmp_path / 'root'} tpu-ls --no-runtime; echo $((6*7))MARK", "Enter")
        screen = tmux.wait_for(lambda s: any(line.strip() == "42MARK" for line in s.splitlines()), timeout=60)
    finally:
        tmux.kill()
    words = set(screen.replace(",", " ").replace("(", " ").replace(")", " ").split())
    headers = ["CHIP", "KIND", "PLATFORM", "PER", "MEMORY", "TOTAL", "PCI", "NUMA", "NODES", "PROCESSES"]
    assert all(word in words for word in headers), words  # every header word whole: in the table or the caption
    assert "shown at this width:" in screen
    assert "CHIP   KIND" in screen


# --- the terminal's size from the environment ------------------------------------------------------------
# COLUMNS=99999999999 made tpu-top --once build a frame that wide (internal error: MemoryError), and rich reads
# COLUMNS with str.isdigit() and int(), so COLUMNS=² was an internal error of every table on a terminal.

@pytest.mark.parametrize("size", ["99999999999", "9" * 60, "²", "٣٠", "0", "-3", ""])
@pytest.mark.parametrize("command", [("tpu-top", "--once"), ("tpu-ls", "--format", "table")])
def test_any_terminal_size_in_the_environment_is_bounded(command, size):
    result = run_tool(*command, env=clean_env(COLUMNS=size, LINES=size, JAX_PLATFORMS="cpu"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert lines
    assert max(len(line) for line in lines) <= MAX_COLUMNS


def test_the_size_to_draw_for_is_bounded_and_read_in_ascii_digits(monkeypatch):
    own = tuple(os.get_terminal_size(1)) if os.isatty(1) else (120, 24)  # what a size not given means
    for columns, lines, expected in [("99999999999", "99999999999", (MAX_COLUMNS, MAX_LINES)), ("100", "30", (100, 30)),
                                     ("٣٠", "²", own), ("0", "-1", own), ("1_0", " 7 ", own)]:
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setenv("LINES", lines)
        assert tuple(terminal_size(None, (120, 24))) == expected, (columns, lines)


def test_tpu_top_draws_for_the_terminal_it_is_in_whatever_columns_and_lines_say():
    require_program("tmux")
    bin_dir = str(Path(tool_command("tpu-top")[0]).parent)
    env = clean_env(TERM="xterm-256color")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    tmux = Tmux(100, 30, env)
    try:
        tmux.keys("clear; COLUMNS=3000 LINES=5000 tpu-top --interval 1", "Enter")
        # laid out for the 100 columns it has: the header's last word on the first row
        screen = tmux.wait_for(lambda s: s.splitlines()[0].rstrip().endswith("h help"), timeout=60)
        tmux.keys("q")
    finally:
        tmux.kill()
    assert screen.splitlines()[0].startswith(" tpu-top"), screen
