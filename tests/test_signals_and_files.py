"""SIGTERM keeps partial results; output files are atomic, never replaced without --force, never followed links;
XLA's aborts (unknown flags, absurd shapes) become one line; a slow metrics service costs one deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import assert_one_line_error, clean_env, run_tool, tool_command
from terminal import StderrOnTerminal

from tpu_tools.atomic import check_writable, write_file
from tpu_tools.errors import UsageError

CPU = {"JAX_PLATFORMS": "cpu"}


def _terminate(process: subprocess.Popen, settle_s: float) -> tuple[str, str]:
    time.sleep(settle_s)
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=90)
    finally:
        process.kill()


# --- bug 3: SIGTERM ------------------------------------------------------------------------------------

def test_sigterm_keeps_the_bench_results_and_exits_143(tmp_path):
    out = tmp_path / "r.json"
    # stderr on a terminal, where tpu-bench draws its progress bar: it names the case in flight
    with StderrOnTerminal([*tool_command("tpu-bench"), "matmul", "--size", "256", "--dtype", "f32",
                           "--min-time", "60", "--json", str(out)],
                          clean_env(TERM="xterm", COLUMNS="120", **CPU)) as run:
        run.wait_for("matmul f32 256")
        _, stderr = run.finish(signal.SIGTERM)
    process = run.process
    assert process.returncode == 143, stderr
    assert "partial results written to" in stderr
    assert "Traceback" not in stderr
    document = json.loads(out.read_text())
    assert document["interrupted"] is True
    statuses = [r["status"] for r in document["results"]]
    assert "interrupted" in statuses
    assert set(statuses) <= {"ok", "interrupted", "not_run"}
    assert "terminated (SIGTERM)" in [r["message"] for r in document["results"]]


def test_an_interrupt_python_swallows_in_a_gc_callback_is_kept_for_the_benchmark_run(capfd):
    """jax runs Python at every garbage collection: a signal's exception raised there is only printed by Python
    ("Exception ignored in"), and the run would go on; tpu-bench keeps it and raises it at its next check."""
    import gc

    from tpu_tools.bench.interrupts import kept_interrupts, raise_kept_interrupt
    from tpu_tools.signals import Terminated

    armed: list[bool] = []  # only the collection the test makes raises, not one the interpreter starts by itself

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and armed:
            armed.clear()
            raise Terminated  # what tpu_tools.signals' handler raises when SIGTERM lands here

    gc.callbacks.append(callback)
    try:
        with kept_interrupts():
            armed.append(True)
            gc.collect()
            with pytest.raises(Terminated, match="^$"):
                raise_kept_interrupt()
            raise_kept_interrupt()  # raised once
    finally:
        gc.callbacks.remove(callback)
    assert capfd.readouterr().err == ""  # no "Exception ignored" traceback


def test_sigterm_keeps_the_profile_and_exits_143(tmp_path):
    script = tmp_path / "loop.py"
    marker = tmp_path / "running"
    script.write_text("import pathlib, time, jax, jax.numpy as jnp\nf = jax.jit(lambda x: x * 2)\n"
                      "for i in range(10**9):\n    f(jnp.ones(4)).block_until_ready()\n    time.sleep(0.02)\n"
                      f"    if i == 20:\n        pathlib.Path({str(marker)!r}).touch()\n")
    out = tmp_path / "prof"
    process = subprocess.Popen([*tool_command("tpu-profile"), "run", "--quiet", "--out", str(out), "--", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**CPU))
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    _, stderr = _terminate(process, 0.5)
    assert process.returncode == 143, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["program"]["status"] == "interrupted"
    assert summary["program"]["exit_code"] == 143
    assert any("terminated (SIGTERM)" in note for note in summary["notes"])
    assert summary["top_ops"], "the trace until SIGTERM is summarised"


# --- bug 14: os._exit in a profiled program -----------------------------------------------------------

def test_a_program_ending_in_os_exit_keeps_its_profile(tmp_path):
    script = tmp_path / "quit.py"
    script.write_text("import os, jax, jax.numpy as jnp\njax.jit(lambda x: x + 1)(jnp.ones(4)).block_until_ready()\n"
                      "os._exit(5)\n")
    result = run_tool("tpu-profile", "run", "--quiet", "--out", str(tmp_path / "p"), "--", str(script),
                      env=clean_env(**CPU))
    assert result.returncode == 5, result.stderr
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["program"]["exit_code"] == 5
    assert any("os._exit(5)" in n for n in summary["notes"])


# --- bug 7 and bug 12: what XLA would abort on ------------------------------------------------------------

def test_hlo_refuses_an_absurd_shape_before_xla_aborts(tmp_path):
    (tmp_path / "mymod.py").write_text("def f(x, y):\n    return x @ y\n")
    spec = "f32[99999999999,99999999999]"
    result = run_tool("tpu-profile", "hlo", "mymod:f", "--arg", spec, "--arg", spec, "--out", str(tmp_path / "h"),
                      env=clean_env(**CPU), cwd=tmp_path)
    assert_one_line_error(result, 2, "far beyond any device")


@pytest.mark.parametrize("args", [["tpu-bench", "dispatch", "--min-time", "0.01"],
                                  ["tpu-profile", "run", "--", "x.py"]])
def test_an_unknown_xla_flag_is_one_sentence(tmp_path, args):
    (tmp_path / "x.py").write_text("import jax\njax.devices()\n")
    result = run_tool(*args, env=clean_env(XLA_FLAGS="--bogus", **CPU), cwd=tmp_path)
    message = assert_one_line_error(result, 2, "XLA does not know the flag --bogus")
    assert "F1" not in result.stderr, message
    assert "parse_flags_from_env" not in result.stderr, message


# --- bug 13: output files ------------------------------------------------------------------------------

def test_the_atomic_writer_refuses_an_existing_file_and_never_follows_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="already exists; use --force"):
        write_file(link, "new", force=False, option="--json")
    write_file(link, "new", force=True, option="--json")
    assert victim.read_text() == "precious"
    assert not link.is_symlink()
    assert link.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_the_atomic_writer_keeps_a_file_that_appeared_meanwhile(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    check_writable(target, False)
    target.write_text("someone else's")
    with pytest.raises(UsageError, match="already exists"):
        write_file(target, "mine", force=False)
    assert target.read_text() == "someone else's"


def test_bench_json_refuses_an_existing_file_before_running(tmp_path):
    existing = tmp_path / "r.json"
    existing.write_text("{}")
    result = run_tool("tpu-bench", "dispatch", "--json", str(existing), env=clean_env(**CPU))
    assert_one_line_error(result, 2, "already exists; use --force to replace it")
    assert existing.read_text() == "{}"
    assert result.stdout == ""  # refused before running: no table


def test_bench_json_with_force_replaces_a_planted_link_not_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "r.json").symlink_to(victim)
    result = run_tool("tpu-bench", "dispatch", "--mode", "compiled", "--min-time", "0.01", "--json",
                      str(tmp_path / "r.json"), "--force", env=clean_env(**CPU))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "tpu-tools/bench/v1"


def test_collectives_json_refuses_an_existing_file(tmp_path):
    existing = tmp_path / "c.json"
    existing.write_text("{}")
    result = run_tool("tpu-collectives-test", "--json", str(existing), env=clean_env(**CPU))
    assert_one_line_error(result, 2, "already exists; use --force")
    assert existing.read_text() == "{}"


# --- bug 9: one deadline per read of a slow metrics service ---------------------------------------------

def test_a_slow_metrics_service_costs_at_most_the_deadline():
    from libtpu_server import FakeMetricsService, v5e_host

    from tpu_tools.metrics.libtpu.client import LibtpuClient

    with FakeMetricsService(v5e_host()) as slow:
        slow.servicer.delay_s = 1.5  # every call: listing, then the reads
        with LibtpuClient([slow.address], timeout_s=2.0) as client:
            snapshot = client.snapshot()[0]
    # Each call alone (1.5 s) is within 2 s: only one deadline for the listing and the reads together (3 s)
    # makes the snapshot an error, so the error proves the deadline is shared, with no clock read here.
    assert snapshot.error == f"the metrics service at {slow.address} did not answer within 2 s"


def test_os_environ_is_untouched_by_the_flag_check():
    from tpu_tools.pjrt.runtime import RuntimePolicy, check_xla_flags

    before = dict(os.environ)
    check_xla_flags(RuntimePolicy(platform="cpu", host_devices=2))  # only the toolkit's own flag: no child
    assert dict(os.environ) == before


_SIGNAL_INSIDE_AN_IMPORT = """
import os, signal, sys, time
import click
from tpu_tools.cli.common import run_cli

@click.command()
def command():
    if os.environ.get("WITH_JAX"):
        import jax
        jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # the runtime and its threads are up
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    except KeyboardInterrupt as error:  # as an import machinery that reports any failure as its own
        raise ImportError("the module could not be imported") from error

run_cli(command, prog_name="prog")
"""


@pytest.mark.parametrize("jax_loaded", [False, True])
def test_a_signal_turned_into_another_error_still_exits_as_the_signal(tmp_path, jax_loaded):
    script = tmp_path / "prog.py"
    script.write_text(_SIGNAL_INSIDE_AN_IMPORT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=clean_env(JAX_PLATFORMS="cpu", WITH_JAX="1" if jax_loaded else None))
    assert (done.returncode, done.stderr) == (143, "prog: terminated\n")
