"""`tpu-top`: frames at any size, `--once` in a pipe, and the live view in a real terminal (tmux)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from agentjobs import agent_env, make_rundir, remove_rundir, start_job
from conftest import as_report, assert_one_line_error, run_tool, tool_command
from isolation import showing, wait_for_screen
from programs import require_program

from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.keys import handle_key
from tpu_tools.top.model import ViewState, rows_from_report

# Two real JAX jobs serve this module's tests: in a parallel run they stay on one worker.
pytestmark = pytest.mark.xdist_group("top-jobs")


def _agent(pid: int, tag: str, device_bytes: int, steps: float, recompiles: int = 0) -> dict:
    return {
        "pid": pid, "tag": tag, "user": "alice", "command": f"/usr/bin/python train.py --run {tag}", "error": None,
        "cpu_percent": 50.0, "rss_bytes": 2 << 30, "threads": 12, "device_memory_used_bytes": device_bytes,
        "compiles": {"compile_count": 3 + recompiles, "recompile_count": recompiles, "trace_time_s": 0.1,
                     "lowering_time_s": 0.2, "backend_compile_time_s": 1.5, "cache_hits": 0, "cache_misses": 2,
                     "recent_recompiles": [{"function": "train_step", "backend_compile_time_s": 0.4,
                                            "reason": "different input types; at x, now f32[16] and before f32[8]"}]
                     if recompiles else []},
        "steps": {"count": 100, "steps_per_second": steps, "last_step_time_s": 0.1, "p50_step_time_s": 0.1,
                  "p99_step_time_s": 0.2},
    }


def _report(agents: int = 3, devices: int = 4) -> dict:
    return {
        "schema": "tpu-tools/monitor/v1", "hostname": "tpu-vm-1", "time_unix_s": 1.7e9,
        "host": {"error": None, "cpu_percent": 42.0, "cpu_count": 96, "memory_used_bytes": 100 << 30,
                 "memory_total_bytes": 400 << 30, "load_average_1m": 3.5, "load_average_5m": 3.0,
                 "load_average_15m": 2.0, "swap_used_bytes": 0, "swap_total_bytes": 0},
        "devices": {"error": None, "devices": [
            {"key": f"tpu:{i}", "platform": "tpu", "name": "TPU v5e", "memory_used_bytes": (i + 1) << 30,
             "memory_total_bytes": 16 << 30, "utilization_percent": 10.0 * i, "holders": [],
             "processes": [{"pid": 1000, "tag": "big"}]} for i in range(devices)]},
        "processes": {"error": None, "holders": [], "agents": [
            _agent(1000 + i, ["big", "small", "mid"][i % 3] + (str(i) if i > 2 else ""),
                   [8 << 30, 1 << 30, 4 << 30][i % 3], [2.0, 30.0, 10.0][i % 3], recompiles=i % 2)
            for i in range(agents)]},
    }


def _tags(frame: str) -> list[str]:
    """The TAG column of the process rows, top to bottom."""
    return [line.split()[2] for line in frame.splitlines() if line.split()[1:2] == ["alice"]]


@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 60), (40, 12)])
def test_frame_fits_the_terminal(width, height):
    for report in (_report(), _report(agents=80, devices=40), {"schema": "tpu-tools/monitor/v1"}):
        lines = render(as_report(report), ViewState(), width, height)
        assert len(lines) == height
        assert all(len(line.text) <= width for line in lines)
        assert lines[-1].text.startswith(" q quit")


def test_process_panel_sorted_by_device_memory_and_keys_act():
    report = _report()
    state = ViewState()
    text = frame_text(render(as_report(report), state, 120, 40))
    assert _tags(text) == ["big", "mid", "small"]  # DEV MEM, biggest first
    assert "sorted by DEV MEM" in text
    handle_key(state, "s", rows_from_report(as_report(report)))  # next column: COMP
    handle_key(state, "s", rows_from_report(as_report(report)))  # RECOMP
    handle_key(state, "s", rows_from_report(as_report(report)))  # STEP/S
    text = frame_text(render(as_report(report), state, 120, 40))
    assert "sorted by STEP/S" in text
    assert _tags(text) == ["small", "mid", "big"]
    handle_key(state, "r", rows_from_report(as_report(report)))
    text = frame_text(render(as_report(report), state, 120, 40))
    assert _tags(text) == ["big", "mid", "small"]
    handle_key(state, "S", rows_from_report(as_report(report)))
    assert state.sort.key == "recompiles"
    handle_key(state, "p", [])
    assert "PAUSED" in frame_text(render(as_report(report), state, 120, 40)).splitlines()[0]
    handle_key(state, "h", [])
    assert "tpu-top keys" in frame_text(render(as_report(report), state, 120, 40))
    handle_key(state, "x", [])
    assert "tpu-top keys" not in frame_text(render(as_report(report), state, 120, 40))
    assert handle_key(state, "q", []) == "quit"


def test_selection_follows_the_process_and_shows_its_recompile():
    report = _report()
    state = ViewState()
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert " 1000 big: steps 100" in frame  # the first row is selected
    handle_key(state, "down", rows_from_report(as_report(report)))
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert " 1002 mid: steps 100" in frame
    assert "last recompile: none" in frame
    handle_key(state, "j", rows_from_report(as_report(report)))
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert " 1001 small: steps 100" in frame
    assert "last recompile: train_step (400.00 ms): different input types; at x, now f32[16]" in frame
    del report["processes"]["agents"][1]  # the selected process exits: the selection moves to a neighbour
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert "1001" not in frame
    assert " 1002 mid: steps" in frame


def test_device_panel_shows_figures_from_other_sources():
    frame = frame_text(render(as_report(_report(devices=2)), ViewState(), 120, 40))
    device_rows = [line for line in frame.splitlines() if line.startswith(" tpu:")]
    assert len(device_rows) == 2
    assert "2.0 GiB / 16.0 GiB" in device_rows[1]
    assert " 10.0 " in device_rows[1]
    assert "[||" in device_rows[1]
    assert "1000 big" in device_rows[1]


def test_not_a_terminal_without_once_is_a_clear_error():
    rundir = make_rundir()
    try:
        result = run_tool("tpu-top", env=agent_env(rundir))
        assert_one_line_error(result, 2, "needs a terminal", "--once")
        assert result.stdout == ""
    finally:
        remove_rundir(rundir)


@pytest.mark.parametrize("args", [["--interval", "0"], ["--interval", "0.01"], ["--sort", "nope"],
                                  ["--tag-filter", "("], ["--pid", "x"], ["--pid", "0"]])
def test_bad_options(args):
    result = run_tool("tpu-top", "--once", *args)
    assert_one_line_error(result, 2)


@pytest.fixture(scope="module")
def jobs():
    """Two real JAX jobs with the agent, the first with more device memory (two CPU devices)."""
    path = make_rundir()
    big = start_job(path, tag="bigjob", host_devices=2, explain=True)
    small = start_job(path, tag="smalljob", host_devices=1)
    try:
        yield big.wait_ready(), small.wait_ready(), path
    finally:
        big.stop()
        small.stop()
        remove_rundir(path)


def _process_rows(lines: list[str], *pids: int) -> list[list[str]]:
    """The process panel's rows of these PIDs (not the selected-process lines, which also start with a PID)."""
    wanted = {str(pid) for pid in pids}
    return [line.split() for line in lines
            if line.split()[:1] and line.split()[0] in wanted and not line.split()[1].endswith(":")]


def test_once_in_a_pipe_shows_the_jobs(jobs):
    big, small, path = jobs
    result = run_tool("tpu-top", "--once", env=agent_env(path, COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(" tpu-top  host ")
    assert "platform cpu" in lines[0]
    assert all(len(line) <= 80 for line in lines)
    assert "\x1b" not in result.stdout
    rows = _process_rows(lines, big.pid, small.pid)
    assert [r[2] for r in rows] == ["bigjob", "smalljob"]  # sorted by device memory
    big_row = rows[0]
    assert big_row[5] == "2.0M"  # two 1 MiB shards of the job's array, plus small ones rounded away
    assert int(big_row[6]) >= 2
    assert int(big_row[7]) >= 1
    assert float(big_row[8]) > 0
    assert f"cpu:0@{big.pid}" in result.stdout
    assert f"cpu:1@{big.pid}" in result.stdout


# --- in a real terminal --------------------------------------------------------------------------------------

class Tmux:
    """A tmux server of our own with one shell pane of a fixed size."""

    def __init__(self, width: int, height: int, env: dict[str, str]):
        self.socket = f"tt-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.run("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                 *[arg for key in ("TPU_TOOLS_RUNTIME_DIR", "PATH", "TERM") if key in env
                   for arg in ("-e", f"{key}={env[key]}")], "bash --norc --noprofile")
        self.run("set-option", "-t", "t", "window-size", "manual")

    def run(self, *args: str) -> str:
        env = {**self.env, "TERM": "xterm-256color"}
        env.pop("TMUX", None)
        return subprocess.run(["tmux", "-L", self.socket, *args], env=env, capture_output=True, text=True,
                              timeout=30, check=True).stdout

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-t", "t", "-p")

    def wait_for(self, predicate, timeout: float = 20.0) -> str:
        return wait_for_screen(self.screen, predicate, timeout)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminal_env(jobs):
    require_program("tmux")
    _, _, path = jobs
    bin_dir = str(Path(tool_command("tpu-top")[0]).parent)
    env = agent_env(path, TERM="xterm-256color")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def _top_pid(tmux: Tmux) -> int:
    pane_shell = int(tmux.run("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
    children = subprocess.run(["pgrep", "-P", str(pane_shell)], capture_output=True, text=True).stdout.split()
    return int(children[0])


def _terminal_restored(tmux: Tmux, resized: bool = False) -> None:
    # The main screen is back (the marker printed before tpu-top), with the shell's prompt under it. After
    # a resize, tmux itself (like with any full-screen program, top included) carries a few lines of the
    # alternate screen over to the main one, so only the marker and the prompt are checked then.
    tmux.wait_for(lambda s: "MARKER-BEFORE" in s and (resized or "Processes" not in s)
                  and s.rstrip().splitlines()[-1].rstrip().endswith(("$", "#")))
    tmux.keys("stty -a | tr ' ' '\\n' | grep -xE -- '-?(echo|icanon)' | tr '\\n' ' '; echo", "Enter")
    tmux.wait_for(lambda s: "icanon echo" in s)  # line mode and echo are back


@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 60)])
def test_live_view_in_a_terminal(jobs, terminal_env, width, height):
    big, small, path = jobs
    tmux = Tmux(width, height, terminal_env)
    try:
        tmux.keys("clear; echo MARKER-BEFORE; tpu-top --interval 0.5", "Enter")
        # The selected process's details, under the process rows: the frame is painted down to them.
        screen = tmux.wait_for(showing("bigjob", "smalljob", f" {big.pid} bigjob: steps"))
        lines = screen.splitlines()
        assert len(lines) == height
        assert all(len(line) <= width for line in lines)
        assert lines[0].startswith(" tpu-top  host ")
        assert lines[0].rstrip().endswith("h help")
        assert "MARKER-BEFORE" not in screen  # the alternate screen
        rows = _process_rows(lines, big.pid, small.pid)
        assert [row[2] for row in rows] == ["bigjob", "smalljob"]
        assert rows[0][5] == "2.0M"
        assert int(rows[0][7]) >= 1
        assert lines[-1].startswith(" q quit")
        # The selected process's details, then down to the next one.
        assert any(line.startswith(f" {big.pid} bigjob: steps") for line in lines)
        tmux.keys("j")
        tmux.wait_for(lambda s: f" {small.pid} smalljob: steps" in s)
        tmux.keys("k")
        # the recompile reason of the selected job
        tmux.wait_for(showing(f" {big.pid} bigjob: steps", "different input types"))
        # Sort keys.
        tmux.keys("s")
        tmux.wait_for(lambda s: "sorted by COMP" in s)
        tmux.keys("S", "S")
        tmux.wait_for(lambda s: "sorted by RSS v" in s)  # biggest first
        tmux.keys("r")
        tmux.wait_for(lambda s: "sorted by RSS ^" in s)
        # Pause: the clock stops.
        tmux.keys("p")
        paused = tmux.wait_for(lambda s: "PAUSED" in s.splitlines()[0])
        time.sleep(1.5)
        assert tmux.screen().splitlines()[0] == paused.splitlines()[0]
        tmux.keys("p")
        tmux.wait_for(lambda s: "PAUSED" not in s.splitlines()[0])
        # Help overlay, closed by any key.
        tmux.keys("h")
        tmux.wait_for(lambda s: "tpu-top keys" in s)
        tmux.keys("x")
        tmux.wait_for(lambda s: "tpu-top keys" not in s)
        tmux.keys("q")
        _terminal_restored(tmux)
    finally:
        tmux.kill()


def test_resize_and_a_process_that_exits(jobs, terminal_env):
    _, _, path = jobs
    extra = start_job(path, tag="shortlived", light=True, launcher=False).wait_ready()
    tmux = Tmux(80, 24, terminal_env)
    try:
        tmux.keys("clear; echo MARKER-BEFORE; tpu-top --interval 0.3", "Enter")
        tmux.wait_for(lambda s: "shortlived" in s)
        tmux.run("resize-window", "-t", "t", "-x", "120", "-y", "30")

        def redrawn(screen: str) -> bool:
            # The frame of the new size, footer on the new last line: a frame drawn at a size on the way there
            # (tmux may pass one on) is a whole, settled screen too, with the footer higher and blank rows under it.
            lines = screen.splitlines()
            return len(lines) == 30 and len(lines[0].rstrip()) > 100 and lines[-1].startswith(" q quit")

        screen = tmux.wait_for(redrawn)
        assert screen.splitlines()[0].rstrip().endswith("h help")
        extra.stop(signal.SIGKILL)
        tmux.wait_for(lambda s: "shortlived" not in s and "bigjob" in s)
        tmux.keys("C-c")
        _terminal_restored(tmux, resized=True)
    finally:
        extra.stop()
        tmux.kill()


def test_sigterm_restores_the_terminal(jobs, terminal_env):
    tmux = Tmux(80, 24, terminal_env)
    try:
        tmux.keys("clear; echo MARKER-BEFORE; tpu-top", "Enter")
        tmux.wait_for(lambda s: "bigjob" in s)
        os.kill(_top_pid(tmux), signal.SIGTERM)
        _terminal_restored(tmux)
    finally:
        tmux.kill()


_SPARK = set("\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588")


def _graph_cells(line: str) -> int:
    return sum(1 for c in line if c in _SPARK)


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 60)])
def test_history_job_screen_and_filter_in_a_terminal(jobs, terminal_env, width, height):
    big, small, path = jobs
    tmux = Tmux(width, height, terminal_env)
    try:
        tmux.keys("clear; echo MARKER-BEFORE; tpu-top --interval 0.3", "Enter")
        # History: the device's graph appears after a few refreshes and grows with every one.
        def device_row(screen: str) -> str:
            return next((line for line in screen.splitlines() if line.startswith(f" cpu:0@{big.pid}")), "")

        screen = tmux.wait_for(lambda s: _graph_cells(device_row(s)) >= 2)
        first = _graph_cells(device_row(screen))
        screen = tmux.wait_for(lambda s: _graph_cells(device_row(s)) >= first + 3)
        assert all(len(line) <= width for line in screen.splitlines())
        # The history panel with the selected job's steps/s, where there is room for it.
        def steps_line(screen: str) -> str:
            return next((line for line in screen.splitlines() if f"STEP/S of {big.pid} bigjob" in line), "")

        tmux.wait_for(lambda s: " History" in s and _graph_cells(steps_line(s)) >= 1)
        # Enter: the job's own screen, with its compile table and JAX's reason for the recompilation.
        tmux.keys("Enter")
        # JAX's explanation, recorded by the agent, and the full command line
        screen = tmux.wait_for(showing("Compiles by function", "Recent recompiles", f" {big.pid} bigjob", "train_step",
                                       "different input types", f"{big.workdir}/job.py {big.workdir}/ready",
                                       " STEPS ", " p50 ", " p99 "))
        assert screen.splitlines()[-1].startswith(" Esc back")
        tmux.keys("Escape")
        tmux.wait_for(lambda s: " Processes" in s and "smalljob" in s)
        # `/` filters the process panel by text.
        tmux.keys("/", "small")
        screen = tmux.wait_for(lambda s: "filter: /small_" in s)
        tmux.keys("Enter")
        screen = tmux.wait_for(lambda s: "filter: /small" in s and "filter: /small_" not in s)
        assert _process_rows(screen.splitlines(), big.pid, small.pid) == \
            [r for r in _process_rows(screen.splitlines(), small.pid)]
        assert [r[2] for r in _process_rows(screen.splitlines(), big.pid, small.pid)] == ["smalljob"]
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "filter:" not in s and "bigjob" in s and "smalljob" in s)
        tmux.keys("q")
        _terminal_restored(tmux)
    finally:
        tmux.kill()


def test_sigterm_from_the_screen_ends_a_job(jobs, terminal_env):
    big, small, path = jobs
    victim = start_job(path, tag="victim", light=True, launcher=False).wait_ready()
    tmux = Tmux(120, 40, terminal_env)
    try:
        tmux.keys("clear; tpu-top --interval 0.3", "Enter")
        tmux.wait_for(lambda s: "victim" in s)
        tmux.keys("/", "victim", "Enter")
        tmux.wait_for(lambda s: "filter: /victim" in s and not _process_rows(s.splitlines(), big.pid, small.pid))
        tmux.keys("T")
        tmux.wait_for(lambda s: f"send SIGTERM to {victim.pid} (victim)? y / n" in s)
        tmux.keys("y")
        tmux.wait_for(lambda s: f"SIGTERM sent to {victim.pid} (victim)" in s)
        assert victim.process.wait(timeout=10) == -signal.SIGTERM
        tmux.wait_for(lambda s: "no process matches the filter" in s)  # the panel shows it gone
        tmux.keys("q")
    finally:
        tmux.kill()
        victim.stop()


@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv is not installed")
def test_sigkill_on_another_users_process_is_refused(tmp_path):
    """A process of another user, shown as a device holder, cannot be signalled: tpu-top says so.

    Run as root (as in CI), the other user's process runs as `nobody` and tpu-top runs as root without the
    capability to signal anyone (CAP_KILL dropped), so the kernel applies the rule every user meets; run as
    a user, the other user's process is init (PID 1)."""
    require_program("tmux")
    import sysroot

    other = None
    if os.geteuid() == 0:
        dropped = subprocess.run(["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", "true"], capture_output=True)
        if dropped.returncode != 0:
            pytest.skip(f"cannot drop CAP_KILL here: {dropped.stderr.decode().strip()}")
        other = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "60"])
        target, prefix = other.pid, "setpriv --bounding-set=-kill --inh-caps=-kill "
    else:
        target, prefix = 1, ""
    root = tmp_path
    sysroot.v5e_host(root / "sys", holders={target: [0, 1]})
    bin_dir = str(Path(tool_command("tpu-top")[0]).parent)
    env = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "TERM": "xterm-256color"}
    tmux = Tmux(80, 24, env)
    try:
        tmux.keys(f"clear; {prefix}env TPU_TOOLS_SYSROOT={root / 'sys'} tpu-top --interval 0.5 "
                  "--metrics-addr 127.0.0.1:1", "Enter")
        tmux.wait_for(lambda s: any(line.split()[:1] == [str(target)] for line in s.splitlines()))
        tmux.keys("/", str(target), "Enter")
        tmux.wait_for(lambda s: f"filter: /{target}" in s)
        tmux.keys("K")
        screen = tmux.wait_for(lambda s: f"not permitted to signal {target}" in s)
        assert "y / n" not in screen  # refused before asking
        assert (other is None or other.poll() is None)
        assert os.path.exists(f"/proc/{target}")
        tmux.keys("q")
    finally:
        tmux.kill()
        if other is not None:
            other.kill()
            other.wait()


def test_once_in_a_pipe_with_filters(jobs):
    big, small, path = jobs
    result = run_tool("tpu-top", "--once", "--pid", str(small.pid), env=agent_env(path, COLUMNS="100"))
    assert result.returncode == 0, result.stderr
    assert [r[2] for r in _process_rows(result.stdout.splitlines(), big.pid, small.pid)] == ["smalljob"]
    assert f"filter: pid {small.pid}" in result.stdout
    result = run_tool("tpu-top", "--once", "--device", f"cpu:1@{big.pid}", env=agent_env(path, COLUMNS="100"))
    lines = result.stdout.splitlines()
    assert [r[2] for r in _process_rows(lines, big.pid, small.pid)] == ["bigjob"]
    assert any(line.startswith(f" cpu:1@{big.pid}") for line in lines)
    assert not any(line.startswith((f" cpu:0@{big.pid}", f" cpu:0@{small.pid}")) for line in lines)
    result = run_tool("tpu-top", "--once", "--user", "nobody-at-all", env=agent_env(path, COLUMNS="100"))
    assert "no process matches the filter" in result.stdout


@pytest.mark.parametrize("no_color", [False, True])
def test_colours_mean_something_and_no_color_turns_them_off(jobs, terminal_env, no_color):
    tmux = Tmux(100, 30, terminal_env)
    try:
        tmux.keys(("NO_COLOR=1 " if no_color else "") + "tpu-top --interval 0.5", "Enter")
        tmux.wait_for(lambda s: "bigjob" in s)
        styled = tmux.run("capture-pane", "-t", "t", "-p", "-e")
        colours = [code for code in ("38;5;34", "38;5;31", "\x1b[32m", "\x1b[36m") if code in styled]
        if no_color:
            assert not colours
            assert "\x1b[7m" in styled  # reverse video still marks the headers
        else:
            assert colours  # green bars or cyan titles
        tmux.keys("q")
    finally:
        tmux.kill()


def _environment_pages(tmux: Tmux, screen: str, pid: int) -> str:
    """Every page of the environment screen, paged down to the process's last variable: a host with a long
    environment (a GPU machine's image sets dozens of CUDA variables) puts the test's own below the first page."""
    entries = [entry for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if entry]
    last = max(entries).decode("utf-8", "replace").partition("=")[0]  # the screen sorts them as bytes too

    def first_variable(page: str) -> str:
        lines = page.splitlines()
        title = next(i for i, line in enumerate(lines) if line.startswith(" Environment of"))
        return lines[title + 1]

    pages = [screen]
    for _ in range(len(entries)):
        if any(line.startswith(f" {last}=") for line in pages[-1].splitlines()):
            return "\n".join(pages)
        before = first_variable(pages[-1])
        tmux.keys("NPage")
        pages.append(tmux.wait_for(lambda s, before=before: "Environment of" in s
                                   and s.splitlines()[-1].startswith(" Esc back")
                                   and first_variable(s) != before))
    raise AssertionError(f"paging never showed {last}, the last of {len(entries)} variables")


def test_marks_tree_environment_and_mouse_in_a_terminal(jobs, terminal_env):
    big, small, path = jobs
    secret = {"HF_TOKEN": "hf_0123456789abcdefghijklmnopqrstuv", "PLAIN_SETTING": "plain-value"}
    first, second = (start_job(path, tag=f"marked{i}", light=True, launcher=False, extra_env=secret).wait_ready()
                     for i in (1, 2))
    first, second = sorted((first, second), key=lambda job: job.pid)
    tmux = Tmux(120, 40, terminal_env)
    try:
        # The mouse report sent below is xterm's (SGR), whatever tmux's own TERM; tmux writes it a character at
        # a time, so on a busy machine its Esc must not count as a key on its own.
        tmux.keys("clear; TERM=xterm-256color ESCDELAY=2000 tpu-top --interval 0.3 --sort pid", "Enter")
        tmux.keys("/", "marked", "Enter")
        screen = tmux.wait_for(lambda s: "filter: /marked" in s and "Enter keep" not in s
                               and len(_process_rows(s.splitlines(), big.pid, small.pid, first.pid, second.pid)) == 2)
        header = next(line for line in screen.splitlines() if line.split()[:1] == ["PID"])
        assert "TIME" in header
        # a click (SGR mouse report, 1-based) on the second row selects it: `e` then opens its environment
        y = next(i for i, line in enumerate(screen.splitlines()) if line.split()[:1] == [str(second.pid)]) + 1
        for _ in range(5):
            tmux.run("send-keys", "-t", "t", "-l", f"\x1b[<0;10;{y}M\x1b[<0;10;{y}m")
            tmux.keys("e")
            try:
                # the screen's own footer, its last row, is painted last: the environment above it is whole
                screen = tmux.wait_for(lambda s: "Environment of" in s
                                       and s.splitlines()[-1].startswith(" Esc back  up/down"), timeout=10)
            except AssertionError:
                continue  # on a busy machine the key can land inside the report's parsing: click and ask again
            if f"Environment of {second.pid} (marked2)" in screen:
                break
            tmux.keys("e")  # the click came apart on its way (tmux writes it a character at a time): again
            tmux.wait_for(lambda s: "Processes" in s)
        else:
            pytest.fail(f"a click on the row of {second.pid} never selected it")
        shown = _environment_pages(tmux, screen, second.pid)
        assert "HF_TOKEN=<redacted>" in shown
        assert "PLAIN_SETTING=plain-value" in shown
        assert "hf_0123" not in shown
        tmux.keys("e")  # back (as Esc, without its delay); the clicked row is still selected
        tmux.wait_for(lambda s: "Processes" in s)
        tmux.keys("k", "Space", "Space", "t")
        tmux.wait_for(lambda s: "2 marked (space)" in s and "tree (t)" in s and f"*{first.pid}" in s
                      and f"*{second.pid}" in s)
        tmux.keys("T")
        tmux.wait_for(lambda s: "send SIGTERM to 2 marked processes? y / n" in s)
        tmux.keys("y")
        tmux.wait_for(lambda s: "SIGTERM sent to 2 of 2 marked processes" in s)
        assert first.process.wait(timeout=10) == -signal.SIGTERM
        assert second.process.wait(timeout=10) == -signal.SIGTERM
        tmux.keys("q")
    finally:
        tmux.kill()
        first.stop()
        second.stop()
