"""`tpu-profile run` end to end: real JAX programs on the CPU platform, run by the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool, tool_command
from isolation import kill_tmux_server, tmux_command, unique_name
from programs import require_program

SUMMARY_KEYS = {"schema", "source", "created", "host", "versions", "program", "window", "trace", "devices",
                "device_time_us", "top_ops", "modules", "host_dispatch", "compile_source", "compiles",
                "recompilations", "eager", "notes"}
PROGRAM_KEYS = {"argv", "module", "status", "exit_code", "error", "wall_time_s"}
WINDOW_KEYS = {"mode", "delay_s", "duration_s", "start_step", "steps", "opened", "opened_at_s", "closed_at_s",
               "first_step", "last_step", "closed_by", "note"}
TRACE_KEYS = {"dir", "run_dir", "xplane_files", "perfetto_file", "start_time", "duration_us", "hosts",
              "python_frames", "jax_version"}
DEVICE_KEYS = {"device", "op_count", "busy_us", "idle_us", "busy_percent"}
OP_KEYS = {"name", "module", "count", "total_us", "mean_us", "percent_of_device_time"}
MODULE_KEYS = {"name", "op_count", "total_us", "percent_of_device_time"}
DISPATCH_KEYS = {"dispatches", "dispatch_time_us", "mean_dispatch_us", "compiling_dispatches",
                 "compiling_dispatch_time_us"}
COMPILE_KEYS = {"function", "defined_at", "compiles", "traces", "compile_time_s", "trace_time_s", "lowering_time_s",
                "xla_compile_time_s", "persistent_cache_hits", "calls", "cache_hits"}
RECOMPILE_KEYS = {"function", "defined_at", "recompiles", "reasons"}
EAGER_KEYS = {"dispatches", "host_time_us", "ops", "call_sites"}
CALL_SITE_KEYS = {"call_site", "function", "file", "line", "dispatches", "host_time_us", "ops"}

RECOMPILE_PROGRAM = """
    import jax
    import jax.numpy as jnp


    @jax.jit
    def scale(x):
        return x * 2.0 + 1.0


    for n in (3, 4, 5):
        scale(jnp.ones(n, jnp.float32)).block_until_ready()
    for n in (3, 4, 5):
        scale(jnp.ones(n, jnp.float32)).block_until_ready()
    print("done")
"""

EAGER_PROGRAM = """
    import sys
    import jax.numpy as jnp


    def update(y):
        for _ in range(25):
            y = y + 1.0
            y = jnp.tanh(y)
        return y


    update(jnp.ones(8)).block_until_ready()
    print("to stderr", file=sys.stderr)
"""

STEP_PROGRAM = """
    import sys
    import jax
    import jax.numpy as jnp


    @jax.jit
    def train_step(x, w):
        y = jnp.tanh(x @ w)
        return jnp.sort(y, axis=-1)


    x = jnp.ones((64, 128), jnp.float32)
    w = jnp.ones((128, 128), jnp.float32) / 128
    with open(sys.argv[1], "w") as handle:
        handle.write(train_step.lower(x, w).compile().as_text())
    for _ in range(7):
        train_step(x, w).block_until_ready()
"""


def write_program(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def profile(folder: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_tool("tpu-profile", "run", *args, cwd=folder, timeout=timeout,
                    env=clean_env(JAX_PLATFORMS="cpu"))


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def recompiled(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    folder = tmp_path_factory.mktemp("recompile")
    write_program(folder, "prog.py", RECOMPILE_PROGRAM)
    result = profile(folder, "--out", "out", "--", "prog.py")
    assert result.returncode == 0, result.stderr
    return result, summary_of(folder / "out"), folder


def test_recompiling_function_is_named_with_its_count_and_shape_reasons(recompiled):
    result, document, _ = recompiled
    scale = next(row for row in document["compiles"] if row["function"] == "scale")
    assert scale["compiles"] == 3
    assert scale["traces"] == 3
    assert scale["defined_at"] == "prog.py:6"  # the decorator line, as Python numbers a function
    assert scale["calls"] == 6
    assert scale["cache_hits"] == 3
    group = next(g for g in document["recompilations"] if g["function"] == "scale")
    assert group["recompiles"] == 2
    reasons = " | ".join(r["reason"] for r in group["reasons"])
    assert "now f32[4] and before f32[3]" in reasons
    assert "now f32[5] and before" in reasons
    assert all(site.startswith("prog.py:12") for r in group["reasons"] for site in r["call_sites"])
    report = (recompiled[2] / "out" / "report.txt").read_text()
    assert "scale (prog.py:6)" in report
    assert "at x, now f32[4] and before f32[3]" in report
    assert "at x, now f32[4] and before f32[3]" in result.stderr  # the report, printed after the program


def test_program_output_is_left_alone_and_the_location_is_printed(recompiled):
    result, _, _ = recompiled
    assert result.stdout == "done\n"
    assert "TRACING CACHE MISS" not in result.stderr  # explanations are recorded, not printed
    assert "tpu-profile: profile written to out (summary.json, report.txt" in result.stderr
    assert "tensorboard --logdir out/trace" in result.stderr
    assert "ui.perfetto.dev" in result.stderr
    assert "perfetto_trace.json.gz" in result.stderr


def test_output_folder_holds_the_trace_as_jax_wrote_it(recompiled):
    _, document, folder = recompiled
    runs = list((folder / "out" / "trace" / "plugins" / "profile").iterdir())
    assert len(runs) == 1
    names = {p.name for p in runs[0].iterdir()}
    assert any(n.endswith(".xplane.pb") for n in names)
    assert any(n.endswith(".trace.json.gz") for n in names)
    assert "perfetto_trace.json.gz" in names
    assert document["trace"]["perfetto_file"].endswith("perfetto_trace.json.gz")
    assert (folder / "out" / "report.txt").read_text().startswith("program: prog.py")


def test_summary_json_schema_is_pinned(recompiled):
    _, document, _ = recompiled
    assert set(document) == SUMMARY_KEYS
    assert document["schema"] == "tpu-tools/profile/v1"
    assert document["source"] == "run"
    assert set(document["program"]) == PROGRAM_KEYS
    assert set(document["window"]) == WINDOW_KEYS
    assert set(document["trace"]) == TRACE_KEYS
    assert document["devices"]
    assert all(set(d) == DEVICE_KEYS for d in document["devices"])
    assert document["top_ops"]
    assert all(set(o) == OP_KEYS for o in document["top_ops"])
    assert document["modules"]
    assert all(set(m) == MODULE_KEYS for m in document["modules"])
    assert set(document["host_dispatch"]) == DISPATCH_KEYS
    assert document["compile_source"] == "monitoring"
    assert all(set(row) == COMPILE_KEYS for row in document["compiles"])
    assert all(set(g) == RECOMPILE_KEYS for g in document["recompilations"])
    assert set(document["eager"]) == EAGER_KEYS
    assert all(set(site) == CALL_SITE_KEYS for site in document["eager"]["call_sites"])
    assert document["program"] == {"argv": ["prog.py"], "module": None, "status": "exited", "exit_code": 0,
                                   "error": None, "wall_time_s": document["program"]["wall_time_s"]}


def test_summary_command_renders_the_run_folder_the_same(recompiled):
    _, document, folder = recompiled
    result = run_tool("tpu-profile", "summary", "out", "--json", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == document
    text = run_tool("tpu-profile", "summary", "out", cwd=folder)
    assert text.stdout == (folder / "out" / "report.txt").read_text()


def test_eager_ops_in_a_loop_are_flagged_with_their_call_site(tmp_path):
    write_program(tmp_path, "loop.py", EAGER_PROGRAM)
    result = profile(tmp_path, "--out", "out", "--", "loop.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("to stderr\n")
    eager = summary_of(tmp_path / "out")["eager"]
    ops = {op["name"]: op["count"] for op in eager["ops"]}
    assert ops["add"] == 25
    assert ops["tanh"] == 25
    top = eager["call_sites"][0]
    assert top["function"] == "update"
    assert top["file"] == "loop.py"
    assert top["line"] == 6
    assert top["dispatches"] == 50
    assert top["ops"] == {"add": 25, "tanh": 25}
    assert "update (loop.py:6)" in result.stderr
    assert "candidates for jax.jit" in result.stderr


def test_jitted_step_top_ops_match_the_program(tmp_path):
    write_program(tmp_path, "step.py", STEP_PROGRAM)
    result = profile(tmp_path, "--out", "out", "--", "step.py", str(tmp_path / "step.hlo"))
    assert result.returncode == 0, result.stderr
    document = summary_of(tmp_path / "out")
    compiled_hlo = (tmp_path / "step.hlo").read_text()
    step_ops = [op for op in document["top_ops"] if op["module"] == "jit_train_step"]
    assert step_ops, document["top_ops"]
    # Which op took longest is the machine's call (a broadcast preempted once outlasts seven tiny steps on a
    # loaded host); that the ops are ranked by their device time is the summary's.
    percents = [op["percent_of_device_time"] for op in document["top_ops"]]
    assert percents == sorted(percents, reverse=True)
    for op in step_ops:
        assert op["name"] in compiled_hlo, op["name"]  # an instruction of the compiled program
        assert op["count"] == 7  # once per step
    assert sum(op["percent_of_device_time"] for op in document["top_ops"]) == pytest.approx(100, abs=0.1)
    row = next(r for r in document["compiles"] if r["function"] == "train_step")
    assert row["compiles"] == 1
    assert row["calls"] == 7
    assert row["cache_hits"] == 7  # compiled by .lower().compile()
    assert document["recompilations"] == []
    assert not any(site["function"] == "train_step" for site in document["eager"]["call_sites"])
    # (a GPU host's trace also holds its GPU's plane, unused by this CPU program: the rows are found by name)
    cpu = next(row for row in document["devices"] if row["device"] == "cpu:0")
    assert cpu["op_count"] >= 7
    assert cpu["busy_us"] > 0
    assert cpu["busy_us"] + cpu["idle_us"] == pytest.approx(document["trace"]["duration_us"], rel=1e-3)


def test_module_mode_passes_arguments(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_program(package, "train.py", """
        import sys
        import jax.numpy as jnp
        print("argv", sys.argv[1:])
        (jnp.ones(3) * 2).block_until_ready()
    """)
    result = profile(tmp_path, "--out", "out", "--quiet", "-m", "pkg.train", "--", "--lr", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "argv ['--lr', '3']\n"
    assert summary_of(tmp_path / "out")["program"]["module"] == "pkg.train"


def test_sys_exit_3_is_passed_through_with_the_partial_profile_summarised(tmp_path):
    write_program(tmp_path, "exits.py", """
        import sys
        import jax.numpy as jnp
        (jnp.ones(4) * 3).block_until_ready()
        sys.exit(3)
    """)
    result = profile(tmp_path, "--out", "out", "--", "exits.py")
    assert result.returncode == 3, result.stderr
    document = summary_of(tmp_path / "out")
    assert document["program"]["status"] == "exited"
    assert document["program"]["exit_code"] == 3
    assert document["top_ops"]
    assert document["window"]["closed_by"] == "program end"
    assert "exit 3" in (tmp_path / "out" / "report.txt").read_text()


def test_a_script_that_raises_shows_its_traceback_exits_1_and_is_summarised(tmp_path):
    write_program(tmp_path, "raises.py", """
        import jax.numpy as jnp


        def diverge(x):
            raise ValueError("the loss diverged")


        diverge(jnp.ones(4) + 1)
    """)
    result = profile(tmp_path, "--out", "out", "--", "raises.py")
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n  File \"raises.py\"")
    assert "runpy" not in result.stderr
    assert "tpu_tools" not in result.stderr
    assert "ValueError: the loss diverged" in result.stderr
    document = summary_of(tmp_path / "out")
    assert document["program"]["status"] == "raised"
    assert document["program"]["error"] == "ValueError: the loss diverged"
    assert "add" in {op["name"] for op in document["eager"]["ops"]}


def test_a_module_that_does_not_import(tmp_path):
    write_program(tmp_path, "broken.py", "import a_module_that_is_not_there\n")
    result = profile(tmp_path, "--out", "out", "-m", "broken")
    assert result.returncode == 1
    assert "ModuleNotFoundError: No module named 'a_module_that_is_not_there'" in result.stderr
    assert summary_of(tmp_path / "out")["program"]["status"] == "raised"
    missing = profile(tmp_path, "--out", "other", "-m", "no_such_module")
    assert_one_line_error(missing, 2, "no_such_module")
    assert not (tmp_path / "other").exists()


def test_a_script_that_does_not_exist(tmp_path):
    result = profile(tmp_path, "--out", "out", "--", "missing.py")
    assert_one_line_error(result, 2, "cannot run missing.py: no such file")
    assert not (tmp_path / "out").exists()
    assert_one_line_error(profile(tmp_path), 2, "no program to run")


def test_an_existing_output_folder_is_refused_unless_forced(tmp_path):
    write_program(tmp_path, "plain.py", "print('no jax here')\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    refused = profile(tmp_path, "--out", "out", "--", "plain.py")
    assert_one_line_error(refused, 2, "out already exists", "--force")
    assert refused.stdout == ""  # the program did not run
    forced = profile(tmp_path, "--out", "out", "--force", "--", "plain.py")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == "no jax here\n"
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    document = summary_of(tmp_path / "out")
    assert document["trace"] is None
    assert document["window"]["opened"] is False
    assert any("never started a JAX runtime" in n for n in document["notes"])


def test_ctrl_c_keeps_the_trace_so_far(tmp_path):
    write_program(tmp_path, "forever.py", """
        import time
        import jax
        import jax.numpy as jnp


        @jax.jit
        def step(x):
            return jnp.sin(x) * 2.0


        x = step(step(jnp.ones((64,))))  # two calls in the trace before Ctrl-C can come
        x.block_until_ready()
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            x = step(x)
            x.block_until_ready()
            time.sleep(0.005)
    """)
    process = subprocess.Popen([*tool_command("tpu-profile"), "run", "--out", "out", "--", "forever.py"],
                               cwd=tmp_path, env=clean_env(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout.readline() == "ready\n"
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the foreground process group
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert "interrupted; the trace so far is kept" in stderr
    document = summary_of(tmp_path / "out")
    assert document["program"]["status"] == "interrupted"  # not run to its 60 s end
    step = next(r for r in document["compiles"] if r["function"] == "step")
    assert step["calls"] >= 2
    assert list((tmp_path / "out" / "trace").rglob("*.xplane.pb"))


@pytest.mark.budget(40)  # a program of 14 s whose phases the window must fall between
def test_time_window_traces_only_the_window(tmp_path):
    write_program(tmp_path, "phases.py", """
        import time
        start = time.monotonic()
        import jax
        import jax.numpy as jnp


        @jax.jit
        def early(x):
            return x + 1.0


        @jax.jit
        def late(x):
            return x * 3.0


        x = jnp.ones(16)
        # Both compile here, before their phases: a first call of `late` inside the window would compile there.
        # `early` is compiled ahead of time and not run: where a loaded machine brings the runtime up after the
        # delay, the window opens then, and this set-up falls inside it; `early` runs only in its phase, the
        # first 2 s of the program, which is then over before the runtime is up.
        run_early = early.lower(x).compile()
        late(x).block_until_ready()
        while time.monotonic() - start < 2.0:
            x = run_early(x).block_until_ready()
            time.sleep(0.002)
        while time.monotonic() - start < 14.0:
            x = late(x).block_until_ready()
            time.sleep(0.002)
    """)
    # The window opens at the delay, or when the runtime is up if that is later (seconds on a loaded machine).
    # Everything before `late`'s phase must be over by then, importing jax and both compiles included: on a
    # loaded machine under coverage they have taken over 4.5 s, and a window opening at 4.5 s traced them. A
    # window from 8 s to 9 s lies well inside `late`'s phase (from 2 s to 14 s).
    result = profile(tmp_path, "--out", "out", "--quiet", "--delay", "8", "--duration", "1", "--", "phases.py")
    assert result.returncode == 0, result.stderr
    document = summary_of(tmp_path / "out")
    window = document["window"]
    assert window["mode"] == "time"
    assert window["opened"]
    assert window["closed_by"] == "duration"
    assert window["opened_at_s"] >= 7.9  # at the delay, or later where the runtime came up later
    assert document["trace"]["duration_us"] >= 0.8e6  # the 1 s window, which a loaded machine only lengthens
    modules = {op["module"] for op in document["top_ops"]}
    assert "jit_late" in modules
    assert "jit_early" not in modules
    late = next(r for r in document["compiles"] if r["function"] == "late")
    assert late["compiles"] == 1
    assert late["calls"] > 0
    assert late["cache_hits"] == late["calls"]


def test_a_window_that_never_opens_still_reports_the_compiles(tmp_path):
    write_program(tmp_path, "short.py", "import jax.numpy as jnp\n(jnp.ones(3) + 1).block_until_ready()\n")
    result = profile(tmp_path, "--out", "out", "--delay", "60", "--", "short.py")
    assert result.returncode == 0, result.stderr
    document = summary_of(tmp_path / "out")
    assert document["window"]["opened"] is False
    assert document["trace"] is None
    assert any("before the trace window opened at 60 s" in n for n in document["notes"])
    assert any(row["function"] == "add" for row in document["compiles"])
    assert "Perfetto" not in result.stderr


def test_bad_window_options_are_usage_errors(tmp_path):
    assert_one_line_error(profile(tmp_path, "--duration", "0", "--", "x.py"), 2, "--duration")
    assert_one_line_error(profile(tmp_path, "--delay", "-1", "--", "x.py"), 2, "--delay")


def test_the_programs_own_runtime_setup_still_applies(tmp_path):
    # jax is imported only when the program imports it, so set-up before first use still works.
    write_program(tmp_path, "devices.py", """
        import jax
        jax.config.update("jax_num_cpu_devices", 4)
        import jax.numpy as jnp

        print(jax.device_count())
        jax.pmap(lambda x: x * 2.0)(jnp.ones((4, 8))).block_until_ready()
    """)
    result = profile(tmp_path, "--out", "out", "--quiet", "--", "devices.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "4\n"
    # (a GPU host's trace also holds its GPU's plane, unused by this CPU program: the rows are found by name)
    devices = [d["device"] for d in summary_of(tmp_path / "out")["devices"]]
    assert [device for device in devices if device.startswith("cpu:")] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


def test_host_devices_option_applies_before_the_program_starts(tmp_path):
    write_program(tmp_path, "count.py", "import jax\nprint(jax.device_count())\n")
    result = profile(tmp_path, "--out", "out", "--quiet", "--host-devices", "2", "--", "count.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2\n"


def _pane(server: str, session: str) -> str:
    return subprocess.run([*tmux_command(server), "capture-pane", "-p", "-t", session, "-S", "-200"],
                          capture_output=True, text=True).stdout


@pytest.mark.parametrize("size", [(80, 24), (132, 40)])
def test_ctrl_c_in_a_real_terminal(tmp_path, size):
    """Ctrl-C typed in a terminal: the program stops, the report is drawn on the terminal, the trace is kept."""

    require_program("tmux")
    write_program(tmp_path, "spin.py", """
        import time
        import jax.numpy as jnp

        x = (jnp.ones(8) * 1.0001).block_until_ready()  # a multiply in the trace before Ctrl-C can come
        print("spinning", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            x = (x * 1.0001).block_until_ready()
            time.sleep(0.01)
    """)
    session = "tpuprof"
    server = unique_name("tpuprof")
    env = clean_env(JAX_PLATFORMS="cpu")
    command = " ".join([*tool_command("tpu-profile"), "run", "--out", "out", "--", "spin.py"])
    subprocess.run([*tmux_command(server), "new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]),
                    "-c", str(tmp_path), "-e", f"PATH={env['PATH']}", "-e", "JAX_PLATFORMS=cpu",
                    f"{command}; echo EXIT=$?; sleep 30"], check=True)
    try:
        deadline = time.monotonic() + 60
        while "spinning" not in _pane(server, session) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "spinning" in _pane(server, session)
        subprocess.run([*tmux_command(server), "send-keys", "-t", session, "C-c"], check=True)
        deadline = time.monotonic() + 60
        while "EXIT=" not in _pane(server, session) and time.monotonic() < deadline:
            time.sleep(0.2)
        screen = _pane(server, session)
    finally:
        kill_tmux_server(server)
    assert "EXIT=130" in screen, screen
    assert "interrupted; the trace so far is kept" in screen
    assert "Eager ops" in screen
    assert "multiply" in screen  # the report, drawn for a terminal
    assert "Traceback" not in screen
    assert summary_of(tmp_path / "out")["program"]["status"] == "interrupted"


def test_persistent_compilation_cache_hits_are_counted_and_its_log_stays_quiet(tmp_path):
    write_program(tmp_path, "cached.py", """
        import sys
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_compilation_cache_dir", sys.argv[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


        @jax.jit
        def f(x):
            return jnp.sin(x) * 3.0


        f(jnp.ones(5)).block_until_ready()
    """)
    cache = tmp_path / "cache"
    first = profile(tmp_path, "--out", "first", "--quiet", "--", "cached.py", str(cache))
    second = profile(tmp_path, "--out", "second", "--quiet", "--", "cached.py", str(cache))
    for result in (first, second):
        assert result.returncode == 0, result.stderr
        assert "persistent" not in result.stderr.lower()
        assert "CACHE MISS" not in result.stderr
    before = next(r for r in summary_of(tmp_path / "first")["compiles"] if r["function"] == "f")
    after = next(r for r in summary_of(tmp_path / "second")["compiles"] if r["function"] == "f")
    assert before["persistent_cache_hits"] == 0
    assert after["persistent_cache_hits"] == 1


def test_step_window_traces_only_the_marked_steps(tmp_path):
    write_program(tmp_path, "steps.py", """
        import jax
        import jax.numpy as jnp
        import tpu_tools.agent as agent


        @jax.jit
        def warmup_step(x):
            return x + 1.0


        @jax.jit
        def measured_step(x):
            return x * 3.0


        @jax.jit
        def cooldown_step(x):
            return x - 2.0


        x = jnp.ones(16)
        for index in range(6):
            with agent.step_context():
                function = (warmup_step, warmup_step, measured_step, measured_step, cooldown_step,
                            cooldown_step)[index]
                x = function(x).block_until_ready()
    """)
    result = profile(tmp_path, "--out", "out", "--quiet", "--start-step", "2", "--steps", "2", "--", "steps.py")
    assert result.returncode == 0, result.stderr
    document = summary_of(tmp_path / "out")
    window = document["window"]
    assert window["mode"] == "steps"
    assert window["opened"]
    assert window["closed_by"] == "steps"
    assert (window["first_step"], window["last_step"]) == (2, 3)
    modules = {op["module"] for op in document["top_ops"]}
    assert "jit_measured_step" in modules
    assert not modules & {"jit_warmup_step", "jit_cooldown_step"}
    # Compiles are counted over the whole run (warmup_step compiled before the window), calls in the trace only:
    # the report says which is which.
    compiles = {row["function"]: row for row in document["compiles"]}
    assert compiles["warmup_step"]["compiles"] == 1
    assert compiles["warmup_step"]["calls"] == 0
    assert compiles["measured_step"]["calls"] == 2
    report = (tmp_path / "out" / "report.txt").read_text()
    assert "Compilation (jax.monitoring; over the whole run;" in report
    assert "CALLS IN TRACE" in report


def test_a_step_window_past_the_last_step_is_explained(tmp_path):
    write_program(tmp_path, "two.py", """
        import jax.numpy as jnp
        import tpu_tools.agent as agent

        for _ in range(2):
            with agent.step_context():
                (jnp.ones(3) + 1).block_until_ready()
    """)
    result = profile(tmp_path, "--out", "out", "--quiet", "--start-step", "5", "--steps", "1", "--", "two.py")
    assert result.returncode == 0, result.stderr
    document = summary_of(tmp_path / "out")
    assert document["window"]["opened"] is False
    assert any("ended before step 5 was marked" in n for n in document["notes"])


def test_bad_step_window_options_are_usage_errors(tmp_path):
    assert_one_line_error(profile(tmp_path, "--start-step", "2", "--", "x.py"), 2, "--start-step and --steps")
    assert_one_line_error(profile(tmp_path, "--start-step", "1", "--steps", "2", "--delay", "1", "--", "x.py"), 2,
                          "choose one trace window")
    assert_one_line_error(profile(tmp_path, "--start-step", "-1", "--steps", "2", "--", "x.py"), 2, "--start-step")
    assert_one_line_error(profile(tmp_path, "--start-step", "1", "--steps", "0", "--", "x.py"), 2, "--steps")
